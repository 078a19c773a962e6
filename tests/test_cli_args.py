"""Flags from typed configs: a refused value is named as the user gave it, a flag or a field."""

import argparse
import re
from dataclasses import dataclass

import pytest

from threadweaver.cli_args import (
    SettingError,
    add_arguments,
    check_counts,
    check_numbers,
    check_seconds,
    from_args,
    option,
)


@dataclass(frozen=True)
class Settings:
    max_tokens: int = option(8, "Most tokens.")
    n: int = option(1, "Samples.")

    def __post_init__(self):
        check_counts(self, ("max_tokens", "n"))


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, Settings)
    return parser.parse_args(argv)


def test_a_refused_flag_is_named_by_the_flag_and_a_refused_field_by_its_name():
    with pytest.raises(SettingError, match="^--max-tokens must be a whole number of at least 1, not 0$"):
        from_args(Settings, parsed("--max-tokens", "0"))
    with pytest.raises(SettingError, match="^max_tokens must be a whole number of at least 1, not 0$"):
        Settings(max_tokens=0)


def test_a_field_the_caller_set_rather_than_a_flag_keeps_its_name():
    with pytest.raises(SettingError, match="^n must be a whole number of at least 1, not 0$"):
        from_args(Settings, parsed(), n=0)


@dataclass(frozen=True)
class Switches:
    fork: bool = option(True, "Fork.")
    explained: bool = option(False, "Join (default: when asked).")
    rate: float = option(0.5, "Rate.")


def test_every_flag_shows_its_default_on_and_off_flags_too():
    parser = argparse.ArgumentParser()
    add_arguments(parser, Switches)
    shown = " ".join(parser.format_help().split())
    assert "--fork, --no-fork Fork. (default: True)" in shown
    assert "--explained, --no-explained Join (default: when asked). --rate" in shown  # its help says it already
    assert "--rate RATE Rate. (default: 0.5)" in shown


def test_a_number_that_is_not_finite_or_below_the_least_is_refused():
    @dataclass(frozen=True)
    class Rates:
        rate: float = 0.5

    check_numbers(Rates(0), ("rate",))
    for bad in (-1, float("nan"), float("inf"), 10**400, "1", True):
        with pytest.raises(SettingError, match="^rate must be a finite number of at least 0, not "):
            check_numbers(Rates(bad), ("rate",))


def test_a_time_limit_that_is_not_finite_and_more_than_0_seconds_is_refused():
    @dataclass(frozen=True)
    class Limit:
        limit_s: float | None = 5.0

    check_seconds(Limit(0.001), ("limit_s",))
    check_seconds(Limit(None), ("limit_s",), none_ok=True)
    for bad in (0, -1, float("nan"), float("inf"), 10**400, "5", True, None):  # 10**400: OverflowError once
        with pytest.raises(SettingError, match=r"^limit_s must be a finite number of seconds, more than 0, not "):
            check_seconds(Limit(bad), ("limit_s",))
    refused = "limit_s must be a finite number of seconds, more than 0 (or none), not inf"
    with pytest.raises(SettingError, match=re.escape(refused)):
        check_seconds(Limit(float("inf")), ("limit_s",), none_ok=True)


def test_none_as_a_flag_is_none_where_the_setting_takes_it():
    """The refusal says "(or none)", as the library, JSON and lm-eval's model_args take it; argparse read ``none``
    as a float and refused it ("invalid float value: 'none'")."""

    @dataclass(frozen=True)
    class Limit:
        limit_s: float | None = 5.0
        count: int = 3

    def parse(*argv):
        parser = argparse.ArgumentParser(exit_on_error=False)
        add_arguments(parser, Limit)
        return parser.parse_args(argv)

    assert parse("--limit-s", "none").limit_s is None and parse("--limit-s", "NONE").limit_s is None
    assert parse("--limit-s", "2.5").limit_s == 2.5
    with pytest.raises(argparse.ArgumentError, match="invalid float value: 'never'"):
        parse("--limit-s", "never")
    with pytest.raises(argparse.ArgumentError, match="invalid int value: 'none'"):  # a setting with no "none"
        parse("--count", "none")


def test_a_yes_or_no_flag_on_a_trl_parser_takes_trls_forms():
    """``sft --branching false`` was refused ("takes no false") where ``pgrpo``, and TRL's own flags, take it."""
    from transformers import HfArgumentParser
    from trl import SFTConfig

    def parse(*argv):
        parser = HfArgumentParser(SFTConfig, exit_on_error=False)
        add_arguments(parser, Switches)
        return parser.parse_args(["--output_dir", "out", *argv])

    assert (parse().fork, parse().explained) == (True, False)
    forms = {("--fork", "false"): False, ("--fork", "No"): False, ("--no_fork",): False, ("--no-fork",): False}
    forms |= {("--fork",): True, ("--explained",): True, ("--explained", "1"): True, ("--explained", "f"): False}
    assert {argv: (parse(*argv).fork if "fork" in argv[0] else parse(*argv).explained) for argv in forms} == forms
    with pytest.raises(
        argparse.ArgumentError, match=r"must be true or false \(or yes/no, t/f, y/n, 1/0\), not 'maybe'"
    ):
        parse("--fork", "maybe")
