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
    _refused_before_loading(tmp_path, argv, message)


@pytest.mark.parametrize(
    "argv, message",
    [
        # TRL said "GRPO requires at least 2 generations" for 1 only once the model had loaded
        (["--num-generations", "0"], "--num-generations must be a whole number of at least 2, not 0"),
        (["--num-generations", "1"], "--num-generations must be a whole number of at least 2, not 1"),
        # transformers' "max_new_tokens must be greater than 0", after the model loaded
        (["--max-completion-length", "0"], "--max-completion-length must be a whole number of at least 1, not 0"),
        (["--max-completion-length", "-5"], "--max-completion-length must be a whole number of at least 1, not -5"),
        (["--epsilon", "-1"], "--epsilon must be a finite number of at least 0, not -1.0"),
        (["--beta", "-1"], "--beta must be a finite number of at least 0, not -1.0"),
        (["--top-k", "-3"], "--top-k must be -1 or 0 (every token) or at least 1, not -3"),
        (["--reward-weights", "-1", "nan"], "--reward-weights must be finite numbers, not [-1.0, nan]"),
        (["--reward-weights", "1", "inf"], "--reward-weights must be finite numbers, not [1.0, inf]"),
        (
            ["--reward-weights", "-1", "1"],
            "--reward-weights must be at least 0, not [-1.0, 1.0]: a negative weight on correctness would",
        ),
        (
            ["--reward-weights", "1"],
            "--reward-weights takes 2 weights, one per reward (correctness, acceleration), not 1",
        ),
        (["--reward-weights", "1", "1", "1"], "--reward-weights takes 2 weights, one per reward"),
        (["--no-branching", "--acceleration-factor", "3"], "--acceleration-factor is 3.0, but branching is off"),
        (["--no-branching", "--acceleration-form", "ratio"], "--acceleration-form is 'ratio', but branching is off"),
        (["--max-steps", "0"], "--max-steps is 0: nothing would be trained"),
        (
            ["--max-steps", "-1", "--num-train-epochs", "0"],
            "--max-steps is -1 (train by epochs) and --num-train-epochs",
        ),
    ],
)
def test_a_setting_that_was_taken_or_refused_late_is_refused_before_the_model_loads(tmp_path, argv, message):
    """Each was taken without a word, or refused only once the model had loaded (or trained nothing, rc 0)."""
    _refused_before_loading(tmp_path, argv, message)


def _refused_before_loading(tmp_path, argv, message):
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


@pytest.mark.parametrize(
    "problem_count, argv, takes",
    [
        (3, ["--prompts-per-step", "5"], "3 problems, fewer than a step rolls out (--prompts-per-step 5)"),
        (1, ["--prompts-per-step", "2"], "1 problem, fewer than a step rolls out (--prompts-per-step 2)"),
        (
            3,
            ["--prompts-per-step", "2", "--gradient-accumulation-steps", "2"],
            "3 problems, fewer than a step rolls out (4: a generation batch of 32 rollouts, --num-generations 8",
        ),
    ],
)
def test_fewer_problems_than_a_step_rolls_out_are_refused_before_the_model_loads(tmp_path, problem_count, argv, takes):
    """TRL's sampler keeps only full batches of problems: with none, transformers said "There seems not to be a
    single sample in your epoch_iterator", saved the model untrained and the command exited 0."""
    from threadweaver.quickstart.recipe import embedded_models

    problems = tmp_path / "problems.jsonl"
    problems.write_text('{"prompt": "1+1?", "answer": "2"}\n' * problem_count)
    model = str(embedded_models()["parallel"])
    with pytest.raises(ValueError) as refused:
        command.main([model, str(problems), "--output-dir", str(tmp_path / "out"), "--report-to", "none", *argv])
    assert str(refused.value).startswith(f"{problems} has {takes}"), str(refused.value)
    assert str(refused.value).endswith(": nothing would be trained") and not (tmp_path / "out").exists()


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
