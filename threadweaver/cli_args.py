"""Command-line arguments from typed dataclass configs.

Each field's ``help`` metadata is its help; a field without a default is positional.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing


def add_arguments(parser: argparse.ArgumentParser, config_cls: type) -> None:
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        help_text = f.metadata.get("help", "")
        if f.default is dataclasses.MISSING:
            parser.add_argument(f.name, type=kind, help=help_text)
        elif kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=f.default, choices=f.metadata.get("choices"),
                                help=f"{help_text} (default: {f.default})")


def from_args(config_cls: type, args: argparse.Namespace):
    return config_cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_cls)})
