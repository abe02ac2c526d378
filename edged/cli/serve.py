"""`edged serve`: boot the daemon and serve until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

import zmq

from edged.artifact import ArtifactError
from edged.backends import EngineError
from edged.config import ConfigError, load_config

EXIT_CONFIG = 2


def add_parser(commands) -> None:
    p = commands.add_parser("serve", help="run the speech daemon")
    p.add_argument("--config", type=Path, default=None, help="TOML config (default: $CONFIGURATION_DIRECTORY/edged.toml)")
    p.add_argument("--artifact", default=None, help="artifact directory (overrides the config)")
    p.add_argument("--listen", default=None, help="ZeroMQ endpoint, ipc://PATH or tcp://HOST:PORT (overrides the config)")
    p.add_argument("--audio-device", default=None,
                   help='speaker: a device name (as sounddevice matches names) or index; "none": no local playback '
                        '(overrides the config)')
    p.add_argument("--input-device", default=None,
                   help='microphone name or index; "none": no microphone (overrides the config)')
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import faulthandler

    from edged.daemon import Daemon
    from edged.systemd import setup_logging

    faulthandler.enable()  # the watchdog's SIGABRT then prints every thread's stack to the journal
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack, and go on

    try:
        config = load_config(args.config).with_overrides(artifact=args.artifact, listen=args.listen,
                                                         audio_device=args.audio_device, input_device=args.input_device)
    except ConfigError as exc:  # before logging is set up (the config names its level): the same line, on stderr
        print(f"edged serve: boot failed: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.daemon.log_level)
    try:
        code = Daemon(config).run()
    except (ArtifactError, EngineError, ConfigError, OSError, zmq.ZMQError) as exc:  # ZMQError: an endpoint it cannot bind
        logging.getLogger("edged").error("boot failed: %s", exc)
        return EXIT_CONFIG
    from edged.audio.portaudio import stuck

    if stuck():  # PortAudio's exit handler would wait forever on a dead device's stream
        logging.getLogger("edged").warning("a stream of a lost audio device is stuck in PortAudio; exiting without it")
        logging.shutdown()
        os._exit(code)
    return code

