"""bench/sft_gpu.py's CPU smoke: the real ``threadweaver sft`` command trains each arm from the same weights on
the same rows, and the arms a CPU cannot run say why instead of running.

The GPU arms (FlexAttention, varlen, FlashAttention 4) run where a GPU is (bench/RESULTS.md); here the
dense mask trains uncompiled and with accelerate's regional compilation, to the same losses."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
BENCH = Path(__file__).resolve().parents[1] / "bench" / "sft_gpu.py"


def test_the_smoke_trains_the_dense_mask_compiled_to_the_same_losses(tmp_path):
    out = tmp_path / "smoke.json"
    arms = ["dense mask, compiled", "flex FA4, compiled"]
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--arms", *arms, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())["arms"]
    assert list(results) == ["dense mask", *arms], "the oracle runs first"
    assert len(results["dense mask"]["losses"]) == 2
    compiled = results["dense mask, compiled"]
    assert len(compiled["losses"]) == 2 and compiled["max_loss_difference"] < 1e-5, compiled
    assert results["flex FA4, compiled"] == {"skipped": "needs CUDA"}
    assert "dense mask, compiled | 2 losses" in done.stdout
