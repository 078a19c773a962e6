"""Settings and datasets that the TRL plugins would otherwise take without a word: sampling settings the
fork-join rollouts do not apply, a collator ``max_length`` that is not a count, and streamed ``messages``
rows, whose prompt TRL would look for in a ``prompt`` column that is not there."""

import re
import warnings

import pytest
import torch
from datasets import Dataset, IterableDataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from threadweaver.cli_args import SettingError
from threadweaver.hf_collator import TrieCollator
from threadweaver.quickstart.recipe import embedded_models
from threadweaver.synth import chat_row, make_rows
from threadweaver.trl_pgrpo import PGRPOConfig, PGRPOTrainer


def config(tmp_path, **settings) -> PGRPOConfig:
    settings = {"per_device_train_batch_size": 4, "num_generations": 4, **settings}
    return PGRPOConfig(str(tmp_path), use_cpu=True, report_to="none", **settings)


@pytest.mark.parametrize(
    "name, value",
    [
        ("min_p", 0.1),
        ("repetition_penalty", 1.2),
        ("generation_kwargs", {"top_k": 5}),
        ("vllm_structured_outputs_regex", r"\d+"),
    ],
)
def test_a_sampling_setting_the_rollouts_would_ignore_is_refused(tmp_path, name, value):
    with pytest.raises(SettingError, match=f"^{name} is .* sample with temperature, top_p and top_k only"):
        config(tmp_path, **{name: value})


def test_sampling_settings_that_change_nothing_are_taken(tmp_path):
    config(tmp_path, min_p=0.0, repetition_penalty=1.0, generation_kwargs={})


def test_a_numpy_seed_is_a_whole_number(tmp_path):
    import numpy as np

    assert config(tmp_path, seed=np.int64(3)).seed == 3


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"num_generations": 1}, "num_generations must be a whole number of at least 2, not 1"),
        ({"max_completion_length": 0}, "max_completion_length must be a whole number of at least 1, not 0"),
        ({"epsilon": -1.0}, "epsilon must be a finite number of at least 0, not -1.0"),
        ({"epsilon_high": float("inf")}, "epsilon_high must be a finite number of at least 0, not inf"),
        ({"beta": -0.1}, "beta must be a finite number of at least 0, not -0.1"),
        ({"top_k": -3}, "top_k must be -1 or 0 (every token) or at least 1, not -3"),
        ({"reward_weights": [1.0, float("nan")]}, "reward_weights must be finite numbers, not [1.0, nan]"),
        ({"seed": -1}, "seed must be a whole number from 0 to 2**32 - 1, not -1"),
        ({"dataloader_num_workers": -1}, "dataloader_num_workers must be a whole number of at least 0, not -1"),
    ],
)
def test_a_nonsense_rollout_or_loss_setting_is_refused(tmp_path, settings, message):
    """Each was taken (or refused by TRL only once the model had loaded, or by transformers at the first rollout)."""
    with pytest.raises(SettingError, match=f"^{re.escape(message)}"):
        config(tmp_path, **settings)


def test_the_settings_that_disable_or_agree_with_the_baseline_are_taken(tmp_path):
    """top_k -1 and 0 both mean every token (vLLM's and TRL's); the sequential baseline takes the acceleration
    defaults, and a factor of 0, which is what it trains with."""
    for top_k in (-1, 0, 5):
        config(tmp_path, top_k=top_k)
    assert config(tmp_path, branching=False).reward_config().factor == 0.0
    config(tmp_path, branching=False, acceleration_factor=0.0)
    config(tmp_path, reward_weights=[1.0, 0.0], epsilon_high=None, beta=0.0)
    # a script's baseline arm may carry the fork-join arm's acceleration settings (bench/pgrpo_fork.py does)
    assert config(tmp_path, branching=False, acceleration_clip=0.5).reward_config().factor == 0.0


@pytest.mark.parametrize("max_length", [0, -1, 2.5])
def test_a_collator_max_length_that_is_not_a_count_is_refused(synth, max_length):
    """-1 cut one token off every row, and 0 made empty batches."""
    for branching in (True, False):
        with pytest.raises(SettingError, match=f"max_length must be a whole number of at least 1, not {max_length}"):
            TrieCollator(synth, max_length=max_length, branching=branching)


def _streamed(rows: list[dict]) -> IterableDataset:
    def stream():
        yield from rows

    dataset = IterableDataset.from_generator(stream)
    assert dataset.column_names is None  # columns known only as the rows stream
    return dataset


def _trainer(tmp_path, dataset, dtype=torch.float32) -> PGRPOTrainer:
    path = str(embedded_models()["parallel"])
    return PGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(path, dtype=dtype),
        args=config(tmp_path, max_steps=1),
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(path),
    )


def test_streamed_messages_rows_roll_out_their_turns_before_the_solution(tmp_path):
    rows = [chat_row(r, "parallel") for r in make_rows(2, 7, split="inputs")]
    trainer = _trainer(tmp_path, _streamed(rows))
    streamed = list(trainer.train_dataset)
    assert [row["prompt"] for row in streamed] == [row["messages"][:-1] for row in rows]
    assert [row["answer"] for row in streamed] == [row["answer"] for row in rows]


def test_a_streamed_row_without_a_prompt_is_named(tmp_path):
    trainer = _trainer(tmp_path, _streamed([{"question": "A=1+2\nA=?", "answer": "3"}]))
    with pytest.raises(ValueError, match=r"^train_dataset row 0 has the fields \['answer', 'question'\], but no"):
        list(trainer.train_dataset)


@pytest.mark.parametrize(
    "answer, said",
    [
        (None, "is null, not a string or a number"),  # as text, 'None': \boxed{None} would be right
        (float("nan"), "is nan, not a number an answer can be"),
        ([3], "is a list, not a string or a number"),
        (" ", "is empty"),
    ],
)
def test_a_gold_answer_the_reward_cannot_grade_is_named_by_its_line(tmp_path, answer, said):
    import json

    from threadweaver.jsonl import RowError
    from threadweaver.rows import RowReader
    from threadweaver.trl_pgrpo.command import problem_rows

    data = tmp_path / "problems.jsonl"
    data.write_text(
        json.dumps({"prompt": "A=1+2\nA=?", "answer": 3}) + "\n" + json.dumps({"prompt": "B=?", "answer": answer})
    )
    reader = RowReader(AutoTokenizer.from_pretrained(embedded_models()["parallel"]))
    with pytest.raises(RowError, match=f"line 2: field 'answer' {re.escape(said)}$"):
        problem_rows(str(data), reader)
    data.write_text(json.dumps({"prompt": "A=1+2\nA=?", "answer": 3}) + "\n")
    assert problem_rows(str(data), reader) == [{"prompt": "A=1+2\nA=?", "answer": "3"}]


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_an_empty_prompt_is_named_by_its_line(tmp_path, prompt):
    """It was taken: the rollouts would answer the chat template alone."""
    import json

    from threadweaver.jsonl import RowError
    from threadweaver.rows import RowReader
    from threadweaver.trl_pgrpo.command import problem_rows

    data = tmp_path / "problems.jsonl"
    data.write_text(
        json.dumps({"prompt": "A=1+2\nA=?", "answer": 3}) + "\n" + json.dumps({"prompt": prompt, "answer": 3})
    )
    reader = RowReader(AutoTokenizer.from_pretrained(embedded_models()["parallel"]))
    with pytest.raises(RowError, match="^line 2: field 'prompt' is empty$"):
        problem_rows(str(data), reader)


def test_the_rewards_refuse_a_gold_answer_no_response_should_match():
    """A dataset's missing answer is None: as text, 'None', which \\boxed{None} matched."""
    from threadweaver.trl_pgrpo import pgrpo_rewards

    correctness = pgrpo_rewards()[0]
    assert correctness(["so \\boxed{3}"], answer=[3]) == [1.0]
    with pytest.raises(ValueError, match="^the correctness reward: the 'answer' of the batch's row 1 is null, not a"):
        correctness(["\\boxed{3}", "\\boxed{None}"], answer=["3", None])


def test_the_logged_correct_rate_grades_only_answers():
    """With rewards of the user's own, the trainer still logs correct_rate from an 'answer' column: a null
    there is no answer (as text, 'None', which \\boxed{None} matched), and no rate is logged."""
    from threadweaver.trl_pgrpo.trainer import _graded

    assert _graded("so \\boxed{3}", 3, 5.0) is True and _graded("\\boxed{4}", "3", 5.0) is False
    assert _graded("\\boxed{None}", None, 5.0) is None and _graded("\\boxed{nan}", float("nan"), 5.0) is None


def test_a_policy_in_bf16_is_warned_of(tmp_path):
    """AdamW's steps of about the learning rate round away on bf16 weights (integration_tests/test_pgrpo_precision.py
    measures it): the trainer says so, with the fix."""
    rows = Dataset.from_list([{"prompt": "A=1+2\nA=?", "answer": "3"}])
    with pytest.warns(UserWarning, match=r"trained weights are torch.bfloat16, .* \(1e-06\) round away"):
        _trainer(tmp_path, rows, torch.bfloat16)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*round away")
        _trainer(tmp_path, rows)


def test_a_checkpoint_to_resume_from_is_checked_before_anything_loads(tmp_path):
    """transformers' Trainer leaves --resume_from_checkpoint to the script; the command passes it on, and names a
    missing checkpoint before it loads the model (the flag was taken and ignored: training began again)."""
    from threadweaver.trl_pgrpo.command import main

    model, data = str(embedded_models()["parallel"]), str(tmp_path / "problems.jsonl")
    (tmp_path / "problems.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    out = ["--output_dir", str(tmp_path / "out"), "--report_to", "none"]
    with pytest.raises(ValueError, match="^--resume-from-checkpoint last: no whole checkpoint-N folder"):
        main([model, data, *out, "--resume_from_checkpoint", "last"])
    with pytest.raises(ValueError, match=f"^--resume-from-checkpoint {re.escape(model)}: not a whole checkpoint"):
        main([model, data, *out, "--resume_from_checkpoint", model])
