"""`edged` command line: one subcommand per module in this package."""

from __future__ import annotations

import argparse

from edged.cli import bench, client_commands, converse, devices, doors, keys, serve, synth, voice


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edged", description="On-device speech daemon (Qwen3-TTS talker).")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in (serve, client_commands, devices, synth, bench, keys, voice, doors, converse):
        module.add_parser(commands)
    args = parser.parse_args(argv)
    return args.run(args)

