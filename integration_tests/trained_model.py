"""A tiny Qwen3 trained with `threadweaver sft` on the synthetic task, cached between runs.

The trained model is cached under ``.cache/integration-models`` keyed by the recipe, the
source of the core and of the SFT plugin (less the modules training never runs), and the
torch/transformers/TRL versions, so a change to any of them retrains it; CI starts clean and
trains it once per run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

from threadweaver.testing import CLI

REPO = Path(__file__).resolve().parent.parent
SYNTH = ["--min-terms", "2", "--max-terms", "3", "--digits", "3"]
RECIPE = {
    "synth": ["--train", "1600", "--validation", "40", *SYNTH],
    "sft": [
        "--max-steps",
        "200",
        "--learning-rate",
        "3e-3",
        "--warmup-steps",
        "20",
        "--per-device-train-batch-size",
        "8",
        "--logging-steps",
        "20",
    ],
}

_NOT_IN_TRAINING = {"orchestrator.py", "batch.py", "stats.py", "reward.py", "requests.py", "pgrpo.py", "pgrpo_args.py"}
"""Core modules that training never runs (with the quickstart package): editing them keeps the cached model."""


def run_cli(*args, check=True):
    return subprocess.run([CLI, *args], capture_output=True, text=True, check=check)


def _cache_key() -> str:
    digest = hashlib.sha256(json.dumps(RECIPE).encode())
    for package in ("torch", "transformers", "trl"):
        digest.update(version(package).encode())
    for folder in ("threadweaver", "plugins/hf_collator"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name not in _NOT_IN_TRAINING and "quickstart" not in path.parts:
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def trained_model() -> tuple[Path, Path]:
    """(root with ``data/``, the trained model directory), trained on first use."""
    root = REPO / ".cache" / "integration-models" / _cache_key()
    if not (root / "done").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        run_cli("synth", "--out", str(root / "data"), *RECIPE["synth"])
        run_cli("kit", "--out", str(root / "kit"))
        run_cli(
            "sft",
            str(root / "kit"),
            str(root / "data" / "parallel" / "train.jsonl"),
            "--output-dir",
            str(root / "model"),
            *RECIPE["sft"],
        )
        (root / "done").touch()
    return root, root / "model"
