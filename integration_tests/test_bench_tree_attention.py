"""bench/tree_attention_gpu.py's CPU smoke: every phase and arm runs, and the trie arms agree with the dense mask.

The GPU numbers come from running the bench on a GPU (bench/RESULTS.md). Here the tiny shape
runs each arm through the project's own hook, FlexAttention forward only (it has no CPU
backward), ``threadweaver_varlen`` on its CPU reference, in a subprocess: the smoke runs
transformers' FlexAttention uncompiled, which must not leak into other tests.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "tree_attention_gpu.py"
ARMS = ("causal", "threadweaver_varlen", "threadweaver_flex", "whole-tree flex", "threadweaver_sdpa")
FA4_ARMS = ("threadweaver_flex FA4",)


def test_the_smoke_runs_every_arm_and_agrees_with_the_dense_mask(tmp_path):
    out = tmp_path / "smoke.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["logits_dtype"] == "torch.float32"  # the CPU's float32 weights, no autocast

    full = results["full_model"]
    assert [entry["memory_saving"] for entry in full] == ["none", "checkpointing + chunked CE"]
    for entry in full:
        for arm in ARMS:
            assert entry["arms"][arm]["seconds"] > 0, (arm, entry["arms"][arm])
        for arm in FA4_ARMS:  # FlashAttention 4 runs on CUDA only: the arm says why it did not run
            assert entry["arms"][arm] == {"skipped": "FlashAttention 4 needs CUDA"}
        assert 0 < entry["head_pairs"] < entry["visible"] < 1
    agreement = results["agreement"]
    assert agreement["chunked_loss_difference"] < 1e-5
    assert agreement["threadweaver_flex loss_difference"] < 1e-5
    assert agreement["threadweaver_varlen loss_difference"] < 1e-5
    assert agreement["threadweaver_varlen gradient_cosine"] > 1 - 1e-5

    kernel = results["kernel"][0]
    assert kernel["FA4"] == "FlashAttention 4 needs CUDA"
    assert kernel["flash causal ms"] > 0 and kernel["sdpa causal ms"] > 0
    for arm in ("split", "flex trie", "trie varlen"):
        assert kernel[f"relative error, {arm}"] < 1e-5, arm
    assert "segments" in results["trie_varlen_profile"]
    assert all(isinstance(ms, float) for ms in results["kernel_options"]["split ms"].values())
    packed = results["packed"]  # four rows, padded to the longest against packed into one (padding_free)
    (rows, longest), (one, total) = packed["tokens"]["padded"], packed["tokens"]["packed"]
    assert rows == 4 and one == 1 and longest < total < rows * longest
    assert all(arm["seconds"] > 0 for arm in packed["arms"].values()), packed["arms"]
    assert packed["loss_difference_packed_from_padded"] < 1e-5
    (compiled,) = (entry["arms"] for entry in results["compiled"])  # each layer compiled (aot_eager on CPU)
    assert compiled["causal"]["seconds"] > 0
    assert compiled["threadweaver_flex"]["loss_difference_from_dense"] < 1e-5
    assert compiled["causal"]["graph_breaks"] == compiled["threadweaver_flex"]["graph_breaks"] == 0
    assert compiled["threadweaver_flex FA4"] == {"skipped": "FlashAttention 4 needs CUDA"}
    assert all(0 < arm["issue_seconds"] <= arm["seconds"] for arm in full[0]["arms"].values() if "seconds" in arm)
    assert "full model, forward+backward" in done.stdout and "attention kernel alone" in done.stdout
    assert "each layer compiled" in done.stdout and "rows of one batch, padded" in done.stdout


@pytest.mark.slow
def test_the_mixed_precision_smoke_runs_the_trie_under_autocast_compiled_too(tmp_path):
    """``--mixed-precision``: float32 weights under bf16 autocast, as ``threadweaver sft`` trains on a GPU."""
    out = tmp_path / "mixed.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--mixed-precision", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["mixed_precision"] and "float32 under bf16 autocast" in results["model"]
    assert results["logits_dtype"] == "torch.bfloat16", "the forward runs under autocast"
    assert all(entry["arms"][arm]["seconds"] > 0 for entry in results["full_model"] for arm in ARMS)
    assert results["agreement"]["threadweaver_flex loss_difference"] < 1e-3
    (compiled,) = (entry["arms"] for entry in results["compiled"])
    assert compiled["threadweaver_flex"]["graph_breaks"] == 0, "autocast's dtype is read inside the compiled layer"
    assert compiled["threadweaver_flex"]["loss_difference_from_dense"] < 1e-3
