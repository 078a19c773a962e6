"""A subcommand, declared once: its name, help, flags and the function that runs it."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass


def os_error(err: OSError) -> str:
    """An OS error as a command's one line says it: the path it names, then why."""
    where = f"{err.filename}: " if err.filename else ""
    return f"{where}{err.strerror or err}"


def show_warnings() -> None:
    """Warnings of the training commands' own loggers (and their hosts'), each line led by its level and
    logger: without a handler, Python prints a bare message that reads as the command's own output."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def no_arguments(parser: argparse.ArgumentParser) -> None:
    pass


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser that knows its own flags: ``option_strings`` gathers those of every argument
    added with :meth:`add_argument` (``-h`` and ``--help`` too; no command adds arguments through a group)."""

    def __init__(self, *args, **kwargs):
        self.option_strings: set[str] = set()  # before argparse adds --help
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.option_strings.update(action.option_strings)
        return action


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Callable[[argparse.Namespace], None]
    arguments: Callable[[argparse.ArgumentParser], None] = no_arguments
    """Adds the command's flags to its parser."""
    epilog: str | None = None
    own_flags: bool = False
    """Flags it does not declare go to the command as ``args.rest`` (TRL's configs parse them; serve hands
    them to vLLM)."""
    own_help: bool = False
    """``--help`` is the command's own (it prints every flag of the TRL config it fills)."""
    vllm_flags: bool = False
    """Flags after a lone ``--`` go to the vLLM server, as ``args.vllm_args``."""

    def add_to(self, commands) -> None:
        # no abbreviations: with flags that go on to TRL or vLLM, `--branching` must not become `--branching-default`
        parser = commands.add_parser(
            self.name, help=self.help, epilog=self.epilog, add_help=not self.own_help, allow_abbrev=False
        )
        self.arguments(parser)
        parser.set_defaults(command=self, command_parser=parser)  # its own usage in its errors
