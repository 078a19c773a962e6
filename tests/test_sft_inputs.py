"""``threadweaver sft`` refuses a bad MODEL, DATA or setting in one line before anything loads, and a
token id past the model's embeddings naming the row and position, before training starts."""

import json
import logging
import os
import re

import pytest

from threadweaver.hf_collator import sft


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from threadweaver.cli import main

    root = tmp_path_factory.mktemp("sft_inputs")
    main(
        [
            "kit",
            "--out",
            str(root / "k"),
            "--hidden-size",
            "32",
            "--num-attention-heads",
            "1",
            "--num-key-value-heads",
            "1",
        ]
    )
    main(["synth", "--out", str(root / "s"), "--train", "4", "--validation", "1"])
    return root


def test_bad_paths_and_settings_are_named_before_anything_loads(kit):
    model, data = str(kit / "k"), str(kit / "s" / "parallel" / "train.jsonl")
    cases = {
        (model, "nope.jsonl"): "nope.jsonl: no such file",
        (model, str(kit / "s")): f"{kit / 's'}: a folder, not a file of rows",
        (data, model): f"{data}: a file, not a model directory (sft takes MODEL, then DATA)",
        (str(kit / "nomodel"), data): f"{kit / 'nomodel'}: no such directory (a hub id reads org/name)",
        (model, data, "--output_dir", data): f"--output-dir {data}: a file, not a folder",
        (model, data, "--output_dir", ""): "--output-dir is empty",
        (model, data, "--output_dir", model): f"--output-dir {model} is MODEL: saving there would overwrite it",
        (model, data, "--max_length", "0"): "--max-length must be a whole number of at least 1, not 0",
        (model, data, "--max-length", "-1"): "--max-length must be a whole number of at least 1, not -1",
        (model, data, "--learning-rate", "-1"): "--learning-rate must be a finite number of at least 0, not -1.0",
        (model, data, "--learning-rate", "nan"): "--learning-rate must be a finite number of at least 0, not nan",
        (model, data, "--per-device-train-batch-size", "0"): "--per-device-train-batch-size must be a whole number",
        (model, data, "--gradient-accumulation-steps", "0"): "--gradient-accumulation-steps must be a whole number",
        (model, data, "--max-depth", "0"): "--max-depth must be a whole number of at least 1, not 0",
        (model, data, "--warmup-steps", "-3"): "--warmup-steps must be a finite number of at least 0, not -3.0",
        (model, data, "--seed", "-1"): "--seed must be a whole number from 0 to 2**32 - 1, not -1",
        (model, data, "--data-seed", str(2**32)): "--data-seed must be a whole number from 0 to 2**32 - 1",
        (model, data, "--dataloader-num-workers", "-1"): "--dataloader-num-workers must be a whole",
        (model, data, "--output_dir", f"{data}/x"): f"--output-dir {data}/x: cannot write a file in {data}",
        (model, data, "--max_steps", "0"): "--max-steps is 0: nothing would be trained",
        (model, data, "--max_steps", "-1", "--num_train_epochs", "0"): "--max-steps is -1 (train by epochs) and",
        (model, data, "--truncation_mode", "keep_end"): "--truncation-mode keep_end is not applied here: the collator",
        (model, data, "--completion_only_loss", "false"): "--completion-only-loss False is not applied here",
        (model, data, "--assistant_only_loss", "true"): "--assistant-only-loss True is not applied here",
        (model, data, "--dataset-text-field", "content"): "--dataset-text-field content is not applied here",
        (model, data, "--dataset_num_proc", "8"): "--dataset-num-proc 8 is not applied here: the collator tokenises",
        (model, data, "--resume_from_checkpoint", "last"): "--resume-from-checkpoint last: no whole checkpoint-N",
        (model, data, "--resume_from_checkpoint", model): f"--resume-from-checkpoint {model}: not a whole checkpoint",
    }
    out = ["--output_dir", str(kit / "out")]
    for argv, message in cases.items():
        with pytest.raises(ValueError) as refused:
            sft.main([*(argv if "--output_dir" in argv else (*argv, *out)), "--report_to", "none"])
        assert str(refused.value).startswith(message), (argv, str(refused.value))
    assert sorted(p.name for p in kit.iterdir()) == ["k", "s"]


def test_a_token_id_past_the_embeddings_is_named_before_training(kit, tmp_path):
    rows = tmp_path / "ids.jsonl"
    rows.write_text(json.dumps({"id": "a", "prompt_ids": [1, 2], "completion_ids": [5, 99999]}) + "\n")
    with pytest.raises(ValueError) as refused:
        sft.main([str(kit / "k"), str(rows), "--output_dir", str(tmp_path / "out"), "--max_steps", "1"])
    assert str(refused.value) == (
        f"{rows}: line 1 (id a): trajectory token 1: id 99999 is past the model's 64 embedding rows "
        "(--skip-malformed skips such rows)"
    )
    assert not (tmp_path / "out").exists()


def test_max_length_that_cuts_rows_is_told_and_one_that_leaves_nothing_to_train_is_refused(kit, caplog):
    from transformers import AutoTokenizer

    from threadweaver.hf_collator.collator import TrieCollator

    tokenizer, data = AutoTokenizer.from_pretrained(kit / "k"), str(kit / "s" / "parallel" / "train.jsonl")
    whole = [len(r.input_ids) for r in map(TrieCollator(tokenizer).flatten, map(json.loads, open(data)))]
    with caplog.at_level("WARNING"):
        assert len(sft.load_rows(data, TrieCollator(tokenizer, max_length=max(whole)))) == 4
        assert not caplog.records
        sft.load_rows(data, TrieCollator(tokenizer, max_length=max(whole) - 1))
    cut = sum(n == max(whole) for n in whole)
    assert caplog.messages == [
        f"--max-length {max(whole) - 1} cuts {cut} of 4 rows of {data} (the longest is {max(whole)} tokens): "
        "their later tokens are not trained"
    ]
    with pytest.raises(ValueError) as refused:
        sft.main([str(kit / "k"), data, "--output_dir", str(kit / "out"), "--max_length", "3"])
    assert str(refused.value) == (
        f"{data}: --max-length 3 cuts every row inside its prompt, so no row has a trajectory token left to "
        f"train (the longest row is {max(whole)} tokens)"
    )
    assert not (kit / "out").exists()


def test_a_gguf_file_for_model_says_that_prepare_makes_a_model_of_it(kit, tmp_path):
    gguf = tmp_path / "SmolLM2.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    data = str(kit / "s" / "parallel" / "train.jsonl")
    with pytest.raises(
        ValueError, match=r"a file, not a model directory \(sft takes MODEL, then DATA\): `threadweaver prepare` makes"
    ):
        sft.main([str(gguf), data, "--output_dir", str(tmp_path / "out")])


def checkpoint(out, step: int, whole: bool = True):
    """A ``checkpoint-N`` folder as the Trainer leaves it: whole, or cut short before its trainer_state.json."""
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    if whole:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def test_a_run_that_starts_anew_refuses_an_output_dir_holding_an_earlier_run(kit, tmp_path):
    """The Trainer wrote over the earlier model, and with --save-total-limit deleted the earlier checkpoints."""
    model, data = str(kit / "k"), str(kit / "s" / "parallel" / "train.jsonl")
    saved, stopped = tmp_path / "saved", tmp_path / "stopped"
    saved.mkdir()
    (saved / "model.safetensors").write_bytes(b"a finished run's weights")
    checkpoint(stopped, 50)
    checkpoint(stopped, 100)
    for out, held in ((saved, "a saved model"), (stopped, "checkpoint-50, checkpoint-100")):
        with pytest.raises(ValueError) as refused:
            sft.main([model, data, "--output-dir", str(out), "--report-to", "none"])
        assert str(refused.value).startswith(f"--output-dir {out} holds an earlier run ({held}): a run that starts")
        assert ("--resume-from-checkpoint last goes on" in str(refused.value)) == (out == stopped)
    assert (saved / "model.safetensors").read_bytes() == b"a finished run's weights"
    assert sorted(p.name for p in stopped.iterdir()) == ["checkpoint-100", "checkpoint-50"]


def test_resuming_from_the_last_checkpoint_passes_over_one_cut_short_as_it_was_saved(tmp_path, caplog):
    from types import SimpleNamespace

    out = tmp_path / "out"
    checkpoint(out, 2)
    checkpoint(out, 4, whole=False)  # Ctrl-C as it was saved: a SafetensorError traceback on resuming from it
    config = SimpleNamespace(output_dir=str(out), resume_from_checkpoint="last", max_steps=10)
    assert sft.resume_point(config) == str(out / "checkpoint-2")
    assert "checkpoint-4 was cut short as it was saved" in caplog.text
    config.max_steps = 2  # stopped as it saved the model: the resumed run trains no step and saves it
    assert sft.resume_point(config) == str(out / "checkpoint-2")
    config.max_steps = 1  # the Trainer trained no step and said nothing
    with pytest.raises(ValueError, match="it is at step 2, past --max-steps 1: no step is left to train"):
        sft.resume_point(config)
    (out / "checkpoint-2" / "trainer_state.json").unlink()
    config.max_steps = 10
    all_cut = "no whole checkpoint-N folder in --output-dir .*; checkpoint-2, checkpoint-4: cut short as saved"
    with pytest.raises(ValueError, match=all_cut):
        sft.resume_point(config)


def test_a_stopped_run_says_how_to_go_on_from_the_checkpoint_it_kept(tmp_path):
    import types

    from threadweaver.interrupts import Stopped

    def run(save_strategy="steps"):
        return types.SimpleNamespace(output_dir=str(tmp_path), save_strategy=save_strategy)

    for saves, how in ((False, " (with --save-steps N, a stopped run goes on from its last)"), (True, "")):
        with (
            pytest.raises(Stopped) as stopped,
            sft.saying_how_to_go_on(run("steps" if saves else "no")),
        ):  # nothing kept
            raise KeyboardInterrupt
        assert str(stopped.value) == f"stopped before it saved a checkpoint: none of its steps is kept{how}"
        assert stopped.value.status == 130
    checkpoint(tmp_path, 5)  # the run this one resumes saved it: it goes on from there again
    with pytest.raises(Stopped) as stopped, sft.saying_how_to_go_on(run()):
        raise KeyboardInterrupt
    assert str(stopped.value) == (
        f"stopped before it saved a checkpoint; {tmp_path / 'checkpoint-5'}, which it went on from, is kept: rerun "
        "to go on"
    )
    with pytest.raises(Stopped) as stopped, sft.saying_how_to_go_on(run()):
        checkpoint(tmp_path, 3)  # this run's, resumed from a checkpoint before the other
        raise KeyboardInterrupt("SIGTERM")
    assert str(stopped.value) == (
        f"stopped; {tmp_path / 'checkpoint-3'} is kept: rerun with --resume-from-checkpoint last to go on"
    )
    assert stopped.value.status == 143


def test_rows_past_the_models_positions_are_refused_and_max_length_cuts_them(kit, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    from threadweaver.hf_collator.collator import TrieCollator

    model, data = tmp_path / "k", str(kit / "s" / "parallel" / "train.jsonl")
    flatten = TrieCollator(AutoTokenizer.from_pretrained(kit / "k")).flatten
    limit = min(max(flatten(json.loads(row)).position_ids) for row in open(data))  # every row reaches past it
    shutil.copytree(kit / "k", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": limit}))
    argv = [str(model), data, "--output_dir", str(tmp_path / "out"), "--max_steps", "1"]
    with pytest.raises(ValueError) as refused:
        sft.main(argv)
    assert str(refused.value).startswith(
        f"{data}: 4 of 4 rows reach past the {limit} positions the model was made for (its max_position_embeddings), "
        "the first at line 1 ("
    )
    assert f"--max-length {limit} cuts them there; to train on them whole, raise" in str(refused.value)
    assert not (tmp_path / "out").exists()
    assert sft.main([*argv, "--max-length", str(limit)]) == str(tmp_path / "out")


def test_the_training_commands_help_says_how_to_resume():
    """transformers' help for --resume_from_checkpoint says a script of one's own reads it; these commands do."""
    from threadweaver.trl_pgrpo.command import parser as pgrpo_parser

    for parser in (sft.parser(), pgrpo_parser()):
        said = " ".join(parser.format_help().split())
        assert "A checkpoint-N folder to go on from, or 'last' for the newest whole one in --output-dir" in said


def test_a_scaled_rope_reaches_past_max_position_embeddings():
    from transformers import Gemma3TextConfig, Qwen3Config

    assert sft.position_limit(Qwen3Config(max_position_embeddings=64)) == 64
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    assert sft.position_limit(Qwen3Config(max_position_embeddings=64, rope_scaling=yarn)) is None
    assert sft.position_limit(Gemma3TextConfig(max_position_embeddings=64)) == 64  # RoPE settings per layer type
    scaled = {"full_attention": {"rope_type": "linear", "factor": 8.0}, "sliding_attention": {"rope_type": "default"}}
    assert sft.position_limit(Gemma3TextConfig(max_position_embeddings=64, rope_parameters=scaled)) is None


def test_going_on_with_other_rows_or_settings_says_which(tmp_path, caplog):
    """The Trainer goes on from a checkpoint with whatever DATA and settings a resumed run has, and says nothing."""
    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "a"}\n')
    collator = {"branching": True, "train_injected": True, "max_depth": 3, "max_length": 8192}
    folder = checkpoint(tmp_path / "out", 2)
    (folder / sft.RUN_RECORD).write_text(json.dumps(sft.run_record(str(data), collator)))

    def said(record):
        caplog.clear()
        sft.say_what_changed(str(folder), record)
        return [r.getMessage().split(": the Trainer")[0] for r in caplog.records]

    assert said(sft.run_record(str(data), collator)) == []
    copy = tmp_path / "copy.jsonl"  # the same rows elsewhere
    copy.write_bytes(data.read_bytes())
    assert said(sft.run_record(str(copy), collator)) == []
    data.write_text('{"text": "b"}\n')
    collator.update(max_length=None, branching=False)
    assert said(sft.run_record(str(data), collator)) == [
        f"going on from {folder} with DATA {data}, whose rows changed since; --no-branching, where it had --branching; "
        "max_length None, where it had --max-length 8192"
    ]
    assert said(sft.run_record(str(data), {}, "PROBLEMS")) == [  # pgrpo's: no collator settings
        f"going on from {folder} with PROBLEMS {data}, whose rows changed since"
    ]
    pipe = tmp_path / "pipe"  # rows read once, by the run: no digest, and no DATA compared
    os.mkfifo(pipe)
    assert sft.run_record(str(pipe), {})["data_sha256"] is None and said(sft.run_record(str(pipe), {})) == []
    records = ("{", "[]", '{"data": "x", "settings": 3}', '{"data": 5, "data_sha256": "", "settings": {}}', "[" * 10**5)
    for record in records:  # another script's record, a torn one, or one of ours that was tampered with: no comparing
        (folder / sft.RUN_RECORD).write_text(record)
        assert said(sft.run_record(str(data), collator)) == []


def test_resuming_says_nothing_of_missing_keys_that_are_tied_weights_only():
    """transformers warns that a checkpoint lacks ``lm_head.weight`` where it is tied to the embedding (loading
    that restores it); a key that is no tied weight is still said."""
    import torch

    from threadweaver.testing import logged

    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(4, 2)
    model.head = torch.nn.Linear(2, 4, bias=False)
    model.head.weight = model.embed.weight
    trainer_logger = logging.getLogger("transformers.trainer")
    with logged("transformers.trainer") as said:
        with sft.quiet_tied_weights(model):
            trainer_logger.warning(f"{sft.MISSING_KEYS}['head.weight'].")
            trainer_logger.warning(f"{sft.MISSING_KEYS}['head.weight', 'embed.weight'].")
            trainer_logger.warning("Checkpoint included callbacks not included in current configuration.")
        trainer_logger.warning(f"{sft.MISSING_KEYS}['head.weight'].")  # the filter is gone after the run
    assert said == [
        f"{sft.MISSING_KEYS}['head.weight', 'embed.weight'].",
        "Checkpoint included callbacks not included in current configuration.",
        f"{sft.MISSING_KEYS}['head.weight'].",
    ]


@pytest.mark.parametrize(
    "flags, strategy",
    [
        (["--save-steps", "5"], "steps"),  # TRL's default strategy: the flag alone once saved nothing
        (["--save_steps=5"], "steps"),
        (["--max-steps", "5"], "no"),
    ],
)
def test_save_steps_alone_saves_checkpoints_as_in_trl(flags, strategy):
    argv = ["model", "data.jsonl", *flags]
    values = vars(sft.parser().parse_args(argv))
    sft.saving_as_asked(argv, values)
    assert values["save_strategy"] == strategy


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--save-steps", "5", "--save-strategy", "no"], "--save-steps goes with --save-strategy steps (or alone), no"),
        (["--save-strategy", "epoch", "--save-steps", "5"], "--save-steps goes with --save-strategy steps (or alo"),
        (["--save-steps", "0"], "--save-steps must be a whole number of steps, or a share of the run's under 1, not 0"),
        (["--save_steps", "-2"], "--save-steps must be a whole number of steps, or a share of the run's under 1"),
        (["--save-steps", "inf"], "--save-steps must be a whole number of steps"),  # a traceback once
        (["--save-steps", "1.5"], "--save-steps must be a whole number of steps"),  # transformers' refusal, unnamed
        (["--logging-steps", "inf"], "--logging-steps must be a finite number of at least 0, not inf"),
    ],
)
def test_save_steps_that_would_save_nothing_are_refused_before_anything_loads(tmp_path, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        sft.main([str(tmp_path / "no-model"), str(tmp_path / "no-data.jsonl"), *flags])
    assert list(tmp_path.iterdir()) == []
