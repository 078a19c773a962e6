"""``threadweaver pgrpo`` refuses a bad setting in one line, naming the flag as typed, before any model loads."""

import pytest

from threadweaver.trl_pgrpo import command


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--learning-rate", "-1"], "--learning-rate must be a finite number of at least 0, not -1.0"),
        (["--learning-rate", "inf"], "--learning-rate must be a finite number of at least 0, not inf"),
        (["--gradient-accumulation-steps", "0"], "--gradient-accumulation-steps must be a whole number of at least 1"),
        (["--acceleration-clip", "-1"], "--acceleration-clip must be a finite number of at least 0, not -1.0"),
        (["--acceleration-factor", "nan"], "--acceleration-factor must be a finite number of at least 0, not nan"),
    ],
)
def test_a_bad_setting_is_named_by_its_flag_before_the_model_loads(tmp_path, argv, message):
    model = str(tmp_path / "no-model")  # loading it would fail: the refusal comes first
    with pytest.raises(ValueError) as refused:
        command.main([model, str(tmp_path / "problems.jsonl"), "--output-dir", str(tmp_path / "out"), *argv])
    assert str(refused.value).startswith(message), str(refused.value)


def test_prompts_per_step_shows_its_default_once():
    shown = " ".join(command.parser().format_help().split())
    assert "each rolled out --num-generations times. (default: 1)" in shown
    assert "(default: 1). (default: 1)" not in shown


def test_a_missing_model_folder_is_named_before_anything_loads(tmp_path):
    """It was transformers' "Repo id must be in the form 'repo_name'..." OSError, as a traceback."""
    problems = tmp_path / "problems.jsonl"
    problems.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    missing = str(tmp_path / "runs" / "sft")
    with pytest.raises(ValueError) as refused:
        command.main([missing, str(problems), "--output-dir", str(tmp_path / "out")])
    assert str(refused.value).startswith(f"{missing}: ") and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["branching", "skip_malformed", "train_injected"])
def test_sfts_own_switches_turn_off_as_trls_do(name):
    """Its own switches turned off as ``--no-skip_malformed`` only, where TRL's take ``--no_x`` and ``--no-x``."""
    from threadweaver.hf_collator import sft

    parser = sft.parser()
    hyphened = name.replace("_", "-")
    for words in ([f"--{name}"], [f"--{hyphened}"]):
        assert vars(parser.parse_args(["m", "d", *words]))[name] is True
    for words in ([f"--no_{name}"], [f"--no-{hyphened}"]):
        assert vars(parser.parse_args(["m", "d", *words]))[name] is False
    if "_" in name:
        assert f"--no-{name}" not in parser.format_help()


@pytest.mark.parametrize(
    ("command_name", "words"),
    [
        ("pgrpo", ["--prompts_per_step", "3"]),
        ("pgrpo", ["--output_dir", "o"]),
        ("sft", ["--flex_backend", "FLASH"]),
        ("sft", ["--max_depth", "2"]),
        ("sft", ["--skip_malformed"]),
        ("sft", ["--output_dir", "o"]),
    ],
)
def test_the_commands_own_flags_take_both_spellings_as_trls_do(command_name, words):
    """The README says sft's and pgrpo's flags take ``--output-dir`` and ``--output_dir``: TRL's fields did, the
    flags threadweaver adds did not (``--flex-backend``, ``--skip_malformed``, ``--prompts_per_step`` were refused)."""
    from threadweaver.hf_collator import sft

    parser = {"pgrpo": command.parser, "sft": sft.parser}[command_name]()
    flag, *value = words
    hyphened = "--" + flag.removeprefix("--").replace("_", "-")
    underscored_values = vars(parser.parse_args(["m", "d", flag, *value]))
    assert underscored_values == vars(parser.parse_args(["m", "d", hyphened, *value]))
    assert underscored_values != vars(parser.parse_args(["m", "d"]))
