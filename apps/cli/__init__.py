"""The ``threadweaver`` command line: one subcommand per job.

Each subcommand is declared once, as a :class:`~threadweaver.cli.command.Command` beside the
function that runs it: the data commands in :mod:`.data`, the model and server commands in
:mod:`.models`.
"""

from __future__ import annotations

import argparse
import os
import sys

from threadweaver.interrupts import STOPPING_SIGNALS, Stopped, exit_status, interrupt_like_ctrl_c

from .command import CommandParser
from .data import DATA_COMMANDS
from .models import MODEL_COMMANDS

COMMANDS = (*DATA_COMMANDS, *MODEL_COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    from threadweaver import __version__

    parser = argparse.ArgumentParser(
        prog="threadweaver", description="Train, serve and evaluate adaptive parallel reasoning; one subcommand a job."
    )
    parser.add_argument("--version", action="version", version=f"threadweaver {__version__}")
    commands = parser.add_subparsers(dest="name", required=True, metavar="COMMAND", parser_class=CommandParser)
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
    args.rest, args.vllm_args, args.words = rest, passthrough, argv
    interrupt_like_ctrl_c(*STOPPING_SIGNALS)  # a job scheduler's SIGTERM, a closed terminal's SIGHUP: cleanups run
    try:
        command.run(args)
        sys.stdout.flush()  # what a pipe buffered fails here, not at exit
    except KeyboardInterrupt as interrupt:  # Ctrl-C, SIGTERM or SIGHUP
        _stop(command.name, "stopped", exit_status(interrupt))
    except Stopped as stopped:  # the same, where the command kept its finished work
        _stop(command.name, str(stopped), stopped.status)
    except BrokenPipeError:
        if not _reader_left():  # another pipe broke: not ours to hide
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush writes nowhere
        sys.exit(1)


def _stop(name: str, message: str, status: int) -> None:
    print(f"threadweaver {name}: {message}", file=sys.stderr)
    sys.exit(status)


def _reader_left() -> bool:
    """Whether standard output is a pipe whose reader is gone (`threadweaver stats FILE | head`): then the
    command stops quietly, as cat does. Such a pipe polls as an error."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError):  # no descriptor (a replaced stdout): not a pipe of ours
        return False
