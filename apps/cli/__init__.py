"""The ``threadweaver`` command line: one subcommand per job.

Each subcommand is declared once, as a :class:`~threadweaver.cli.command.Command` beside the
function that runs it: the data commands in :mod:`.data`, the model and server commands in
:mod:`.models`.
"""

from __future__ import annotations

import argparse
import os
import sys

from .data import DATA_COMMANDS
from .models import MODEL_COMMANDS

COMMANDS = (*DATA_COMMANDS, *MODEL_COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    from threadweaver import __version__

    parser = argparse.ArgumentParser(
        prog="threadweaver", description="Train, serve and evaluate adaptive parallel reasoning; one subcommand a job."
    )
    parser.add_argument("--version", action="version", version=f"threadweaver {__version__}")
    commands = parser.add_subparsers(dest="name", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_to(commands)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    passthrough: list[str] = []
    if "--" in argv:
        argv, passthrough = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args, rest = parser.parse_known_args(argv)
    command = args.command
    if rest and not command.own_flags:
        args.command_parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if passthrough and not command.vllm_flags:
        args.command_parser.error("only `threadweaver serve` passes flags after --")
    args.rest, args.vllm_args = rest, passthrough
    try:
        command.run(args)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP where a server is running (serve.VLLMServer)
        sys.exit(f"threadweaver {command.name}: stopped")
    except BrokenPipeError:  # the reader left (`threadweaver stats FILE | head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush writes nowhere
        sys.exit(1)
