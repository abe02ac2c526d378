"""The toolchain's third-party chatter (torch's exporter warnings and logs, transformers' and qwen-tts's
prints, a missing `sox` binary's shell message) kept out of the terminal: written to a log file.

At the file-descriptor level, so that what C code and child processes write goes there too; Python's
warnings are shown (once each) into the same file. Whatever escapes the block (an error) is raised
after the terminal's descriptors are back.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def quiet(log: Path) -> Iterator[None]:
    """Inside the block, standard output and error (descriptors 1 and 2) append to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "a") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default")
                yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
