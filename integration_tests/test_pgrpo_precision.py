"""P-GRPO trains float32 weights, under autocast where bf16 is on: AdamW's steps of about the learning rate
(the paper's 1e-6) round away on bf16 weights, so a policy loaded in bf16 barely moved (1.4% of the kit's
weights after a step, against all of them in float32)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from trained_model import run_cli

from threadweaver.quickstart.recipe import embedded_models
from threadweaver.synth import chat_row, make_rows

pytestmark = pytest.mark.slow

START = "half_parallel"
"""Forks on part of the problems, so a group's rollouts differ in speed and a step has a signal."""


def problems(path, n: int):
    with open(path, "w") as f:
        for row in make_rows(n, 3, split="precision"):
            f.write(json.dumps(chat_row(row, "parallel")) + "\n")
    return path


def moved_share(start: dict, trained: dict, learning_rate: float) -> float:
    """The share of the weights a step moved, each by no more than AdamW's step of about the learning rate."""
    moved = total = 0
    for name, before in start.items():
        step = (trained[name].float() - before.float()).abs()
        assert float(step.max()) <= 2 * learning_rate, name  # moved by the optimizer, not rounded
        moved, total = moved + int((step > 0).sum()), total + step.numel()
    return moved / total


def test_the_command_trains_float32_weights_under_bf16(tmp_path):
    model, out = embedded_models((START,))[START], tmp_path / "out"
    flags = ["--max-steps", "1", "--num-generations", "4", "--max-completion-length", "400", "--bf16", "true"]
    run_cli("pgrpo", str(model), str(problems(tmp_path / "p.jsonl", 2)), "--output-dir", str(out), *flags)
    [log] = [entry for entry in json.loads((out / "log_history.json").read_text()) if "loss" in entry]
    assert log["threadweaver/optimizer_step_skipped"] == 0
    start, trained = load_file(model / "model.safetensors"), load_file(out / "model.safetensors")
    assert moved_share(start, trained, 1e-6) > 0.99


def test_the_example_trains_a_bf16_checkpoint_in_float32(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bf16 = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(embedded_models((START,))[START], dtype=torch.bfloat16).save_pretrained(bf16)
    AutoTokenizer.from_pretrained(embedded_models((START,))[START]).save_pretrained(bf16)
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "pgrpo_trl.py")
    command = [sys.executable, example, str(bf16), str(problems(tmp_path / "p.jsonl", 2))]
    subprocess.run([*command, "--output-dir", str(tmp_path / "out"), "--max-steps", "1"], check=True, cwd=tmp_path)
    trained = load_file(tmp_path / "out" / "model.safetensors")
    assert moved_share(load_file(bf16 / "model.safetensors"), trained, 1e-6) > 0.9
