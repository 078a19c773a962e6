"""Command-line arguments from typed dataclass configs.

Each field's ``help`` metadata is its help; a field without a default is positional.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import math
import re
import types
import typing
import urllib.parse


def value_type(hint):
    """``X | None`` and ``Optional[X]`` parse as ``X``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    return hint


def takes_none(hint) -> bool:
    """``X | None`` and ``Optional[X]``."""
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def or_none(kind: type):
    """A flag's type that reads ``none`` (in any case) as None, as the library, a JSON request (null) and lm-eval's
    ``model_args`` take it, and anything else as ``kind`` (whose name argparse's error keeps)."""

    def parse(text: str):
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def option(default, help: str, *, choices: tuple | None = None):
    """A config field with its default and help (and the values it may take): a flag's whole declaration."""
    return dataclasses.field(default=default, metadata={"help": help, **({"choices": choices} if choices else {})})


class SettingError(ValueError):
    """A config's refused field, or fields that disagree: their names and why. The command line names them
    by their flags instead."""

    def __init__(self, names: str | tuple[str, ...], reason: str):
        self.names = (names,) if isinstance(names, str) else names
        self.reason = reason
        super().__init__(f"{' and '.join(self.names)} {reason}")

    def by_flags(self) -> str:
        """The message, naming the fields by their command-line flags."""
        return f"{' and '.join(map(flag, self.names))} {self.reason}"


def flag(name: str) -> str:
    """A config field's command-line flag."""
    return "--" + name.replace("_", "-")


def spellings(name: str) -> list[str]:
    """A flag as TRL's command lines take it: ``--output_dir`` and ``--output-dir``."""
    return [f"--{name}", flag(name)] if "_" in name else [flag(name)]


def given(argv: list[str], name: str) -> bool:
    """Whether ``argv`` sets the flag ``name`` (``--a_b``), spelt with dashes or underscores, with or without ``=``."""
    return any(arg.split("=")[0].replace("-", "_") == name.replace("-", "_") for arg in argv)


def is_number(value) -> bool:
    """A real number (an int or a float), not a bool or a string that reads as one."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_whole(value) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_counts(config, names: typing.Iterable[str], least: int = 1, none_ok: bool = False) -> None:
    """Refuse a config whose fields ``names`` are not whole numbers of at least ``least`` (``none_ok``: or
    None, "no limit"), naming the field."""
    for name in names:
        value = getattr(config, name)
        if value is None and none_ok:
            continue
        if not is_whole(value) or value < least:
            raise SettingError(name, f"must be a whole number of at least {least}, not {value!r}")


def is_finite(value: float) -> bool:
    """``math.isfinite``, for an int past float's range too (which it raises on): no finite float."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_numbers(config, names: typing.Iterable[str]) -> None:
    """Refuse a config whose fields ``names`` are not finite real numbers of at least 0, naming the field."""
    for name in names:
        value = getattr(config, name)
        if not is_number(value) or not is_finite(value) or value < 0:
            raise SettingError(name, f"must be a finite number of at least 0, not {value!r}")


def check_seconds(config, names: typing.Iterable[str], none_ok: bool = False) -> None:
    """Refuse a config whose fields ``names`` are not finite numbers of seconds, more than 0 (``none_ok``: or
    None, "no limit"), naming the field: the one rule for every time limit."""
    for name in names:
        value = getattr(config, name)
        if value is None and none_ok:
            continue
        if not is_number(value) or not is_finite(value) or value <= 0:
            none = " (or none)" if none_ok else ""
            raise SettingError(name, f"must be a finite number of seconds, more than 0{none}, not {value!r}")


def url_problem(url) -> str | None:
    """Why ``url`` cannot be a server's address ("must be an http:// or https:// URL, not 'x'"), or None: the
    one rule for every server URL, as a flag (:func:`check_url`) or a library argument."""
    if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        return f"must be an http:// or https:// URL, not {url!r}"
    if "?" in url or "#" in url:
        return f"must be a server's address, without a query or fragment, not {url!r}"
    if "," in url:
        return f"must be one server's address (http://host:port), not {url!r}; give several space-separated"
    try:
        parts = urllib.parse.urlsplit(url)
        host, _ = parts.hostname, parts.port
    except ValueError as err:  # a port out of range or no number, a bracketed host unclosed
        return f"must be a server's address (http://host:port), not {url!r} ({err})"
    if not host:
        return f"must name a server's host (http://host:port), not {url!r}"
    return None


def check_url(config, name: str, url: str | None = None) -> None:
    """Refuse a server URL (``url``, else the field ``name``'s value) that :func:`url_problem` refuses."""
    url = getattr(config, name) if url is None else url
    if problem := url_problem(url):
        raise SettingError(name, problem)


_HOST_NAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")
"""A host name: labels of letters, digits, ``-`` and ``_`` (as resolvers take them), dot-separated."""


def host_problem(host) -> str | None:
    """Why ``host`` cannot be an address a server listens on (a host name, an IPv4 or IPv6 address), or None:
    the one rule for every ``--host``. An IPv6 address is written bare (``::1``), as vLLM and aiohttp take it."""
    example = "a host name or IP address to listen on (127.0.0.1, 0.0.0.0, ::)"
    if not isinstance(host, str) or not host.strip():
        return f"must be {example}, not {host!r}"
    if "://" in host:
        return f"must be {example}, not a URL: {host!r}"
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:
        return None if bare == host else f"must be an IPv6 address without brackets ({bare}), not {host!r}"
    if ":" in host:
        return f"must be a host without a port (give the port as --port), not {host!r}"
    if not _HOST_NAME.fullmatch(host):
        return f"must be {example}, not {host!r}"
    return None


def check_listen_host(config, name: str = "host") -> None:
    """Refuse a config whose field ``name`` is an address no server can listen on (:func:`host_problem`)."""
    if problem := host_problem(getattr(config, name)):
        raise SettingError(name, problem)


def check_port(config) -> None:
    """Refuse a config whose field ``port`` is outside 0..65535 (0: a free one), naming the field."""
    if not 0 <= config.port <= 65535:
        raise SettingError("port", f"must be a port number (0 to 65535), not {config.port}")


TRUTHS = dict.fromkeys(("true", "yes", "t", "y", "1"), True) | dict.fromkeys(("false", "no", "f", "n", "0"), False)
"""The words TRL's command lines read as yes or no (transformers' ``string_to_bool``); vLLM's request fields take
pydantic's, ``on`` and ``off`` too (``openai_api.SWITCH_WORDS``)."""


def truth(text: str) -> bool:
    """A yes-or-no flag's value as TRL's command lines read it (``--bf16 false``), in any case."""
    try:
        return TRUTHS[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"must be true or false (or yes/no, t/f, y/n, 1/0), not {text!r}") from None


def add_arguments(
    parser: argparse.ArgumentParser,
    config_cls: type,
    exclude: tuple[str, ...] = (),
    include: tuple[str, ...] = (),
    defaults: dict | None = None,
) -> None:
    """A flag per field of ``config_cls`` (only ``include`` if given; never ``exclude`` or non-init fields);
    ``defaults``: this command's own defaults, where they differ from the config's. On TRL's parser a flag
    takes both spellings, as TRL's own (:func:`spellings`)."""
    hints = typing.get_type_hints(config_cls)
    trls = issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter)  # it shows the defaults
    for f in dataclasses.fields(config_cls):
        if f.name in exclude or not f.init or (include and f.name not in include):
            continue
        kind = value_type(hints[f.name])
        help_text = f.metadata.get("help", "")
        default = (defaults or {}).get(f.name, f.default)
        if f.default is dataclasses.MISSING:
            parser.add_argument(f.name, type=kind, help=help_text)
            continue
        names = spellings(f.name) if trls else [flag(f.name)]
        # on TRL's parser, TRL's forms: --x, --x false, and --no_x or --no-x (not BooleanOptionalAction's --no-x_y)
        if kind is bool and trls:
            either = parser.add_mutually_exclusive_group()
            action = either.add_argument(
                *names, dest=f.name, type=truth, nargs="?", const=True, default=default, help=help_text
            )
            either.add_argument(
                *spellings(f"no_{f.name}"),
                dest=f.name,
                action="store_false",
                default=argparse.SUPPRESS,
                help=f"Turns {names[0]} off.",
            )
        elif kind is bool:
            action = parser.add_argument(*names, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            parse = or_none(kind) if takes_none(hints[f.name]) and kind in (int, float) else kind
            action = parser.add_argument(
                *names, type=parse, default=default, choices=f.metadata.get("choices"), help=help_text
            )
        if not (trls or "default" in action.help):  # Python 3.10's BooleanOptionalAction adds its own
            action.help = f"{action.help} (default: {default})"


def from_args(config_cls: type, args: argparse.Namespace, **overrides):
    """``config_cls`` from the parsed flags; a refused field is named by the flag the user typed."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(config_cls) if f.name not in overrides}
    try:
        return config_cls(**values, **overrides)
    except SettingError as err:
        if not set(err.names) <= values.keys():
            raise
        raise SettingError(tuple(map(flag, err.names)), err.reason) from None
