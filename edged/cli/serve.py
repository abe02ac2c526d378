"""`edged serve`: boot the daemon and serve until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from edged.artifact import ArtifactError
from edged.backends import EngineError
from edged.config import ConfigError, load_config

EXIT_CONFIG = 2


def add_parser(commands) -> None:
    p = commands.add_parser("serve", help="run the speech daemon")
    p.add_argument("--config", type=Path, default=None, help="TOML config (default: $CONFIGURATION_DIRECTORY/edged.toml)")
    p.add_argument("--artifact", default=None, help="artifact directory (overrides the config)")
    p.add_argument("--listen", default=None, help="ZeroMQ endpoint, ipc://PATH or tcp://HOST:PORT (overrides the config)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import faulthandler

    from edged.daemon import Daemon
    from edged.systemd import setup_logging

    faulthandler.enable()  # the watchdog's SIGABRT then prints every thread's stack to the journal

    try:
        config = load_config(args.config).with_overrides(artifact=args.artifact, listen=args.listen)
    except ConfigError as exc:
        print(f"edged serve: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.daemon.log_level)
    try:
        return Daemon(config).run()
    except (ArtifactError, EngineError, ConfigError, OSError) as exc:
        logging.getLogger("edged").error("boot failed: %s", exc)
        return EXIT_CONFIG
