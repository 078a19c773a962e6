"""Run the real ``lm_eval`` console script and read what it wrote."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from threadweaver.quickstart.evaluate import read_lm_eval_output

LM_EVAL = os.path.join(os.path.dirname(sys.executable), "lm_eval")


def lm_eval_run(out: Path, *args: str, env: dict | None = None, cli: tuple[str, ...] = (LM_EVAL,)) -> dict:
    """``lm_eval run ARGS --output_path OUT --log_samples``: the results JSON, with ``samples`` per task.
    ``cli``: the command that is lm-eval's CLI."""
    command = [*cli, "run", *args, "--output_path", str(out), "--log_samples"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stderr[-6000:]}"
    return read_lm_eval_output(out)
