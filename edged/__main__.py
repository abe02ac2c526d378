"""`python -m edged` = the `edged` command."""

import sys

from edged.cli import main

sys.exit(main())
