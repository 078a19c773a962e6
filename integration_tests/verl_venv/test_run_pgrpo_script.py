"""examples/verl/run_pgrpo.sh up to verl's trainer: the GPU count, the data it makes or keeps, and
the command line it gives ``verl.trainer.main_ppo``, which composes our config and prints it
(hydra's ``--cfg job``) instead of training. The script sees only the tools put on its PATH: this
venv's python, grep, and, where a case needs one, an ``nvidia-smi`` that lists what the case says.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "verl" / "run_pgrpo.sh"
NO_GPU = "echo 'No devices were found'; exit 6"
TWO_GPUS = "echo 'GPU 0: NVIDIA H100 (UUID: GPU-a)'; echo 'GPU 1: NVIDIA H100 (UUID: GPU-b)'"


def tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run(
    tmp_path: Path,
    *args: str,
    nvidia_smi: str | None = None,
    python: str = sys.executable,
    cwd: Path | None = None,
    **env: str,
) -> subprocess.CompletedProcess:
    tools, model = tmp_path / "bin", tmp_path / "model"
    tools.mkdir(exist_ok=True)
    model.mkdir(exist_ok=True)
    tool(tools, "python", f'exec {python} "$@"')
    if not (tools / "grep").exists():
        os.symlink(shutil.which("grep"), tools / "grep")
    if nvidia_smi is not None:
        tool(tools, "nvidia-smi", nvidia_smi)
    env = {"PATH": str(tools), "HOME": str(tmp_path), "MODEL": str(model), **env}
    command = ["/bin/bash", str(SCRIPT), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.parametrize("nvidia_smi", [None, NO_GPU])
def test_no_gpu_count_stops_with_what_to_set(tmp_path, nvidia_smi):
    done = run(tmp_path, nvidia_smi=nvidia_smi)
    assert done.returncode == 1
    assert done.stderr.startswith("run_pgrpo.sh: cannot count GPUs") and done.stderr.endswith("; set NGPUS\n")


@pytest.mark.parametrize("ngpus", ["0", "two"])
def test_ngpus_must_be_a_positive_count(tmp_path, ngpus):
    done = run(tmp_path, nvidia_smi=TWO_GPUS, NGPUS=ngpus)
    assert (done.returncode, done.stderr) == (1, f"run_pgrpo.sh: NGPUS must be a whole number above 0, not '{ngpus}'\n")


def test_a_missing_model_folder_or_a_python_without_verl_stops_before_the_data_is_made(tmp_path):
    data = tmp_path / "data"
    done = run(tmp_path, nvidia_smi=TWO_GPUS, DATA=str(data), MODEL=str(tmp_path / "nope"))
    assert (done.returncode, done.stderr) == (1, f"run_pgrpo.sh: MODEL {tmp_path / 'nope'}: no such directory\n")
    (tmp_path / "config.json").write_text("{}")  # the model's file, not its folder: "no such directory" was wrong
    done = run(tmp_path, nvidia_smi=TWO_GPUS, DATA=str(data), MODEL=str(tmp_path / "config.json"))
    said = f"run_pgrpo.sh: MODEL {tmp_path / 'config.json'}: a file, not a model directory (the folder that holds"
    assert done.returncode == 1 and done.stderr.startswith(said)
    for typo in ("runs/tw/sft", f"{tmp_path.name}/tw-sft"):  # no hub id: a path, the second in a folder here
        done = run(tmp_path, nvidia_smi=TWO_GPUS, DATA=str(data), MODEL=typo, cwd=tmp_path.parent)
        assert (done.returncode, done.stderr) == (1, f"run_pgrpo.sh: MODEL {typo}: no such directory\n")
    done = run(tmp_path, nvidia_smi=TWO_GPUS, DATA=str(data), python=f"{sys.executable} -S")  # no site-packages
    assert done.returncode == 1 and done.stderr.startswith("run_pgrpo.sh: ") and " has no verl: " in done.stderr
    assert not data.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no GPU")
def test_more_gpus_than_torch_sees_stops_before_ray_waits_for_them(tmp_path):
    data = tmp_path / "data"
    done = run(tmp_path, NGPUS="1", DATA=str(data))
    assert done.returncode == 1 and not data.exists()
    assert done.stderr == (
        "run_pgrpo.sh: NGPUS is 1 but torch sees 0 CUDA device(s) here "
        "(verl's Ray start would wait for the rest without end)\n"
    )


@pytest.mark.parametrize("present", ["train.parquet", "test.parquet"])
def test_a_data_folder_with_one_of_the_two_files_is_refused_untouched(tmp_path, present):
    data = tmp_path / "data"
    data.mkdir()
    (data / present).write_bytes(b"the user's own")
    done = run(tmp_path, nvidia_smi=TWO_GPUS, DATA=str(data))
    assert done.returncode == 1 and done.stderr.startswith(f"run_pgrpo.sh: {data} has only one of")
    assert os.listdir(data) == [present] and (data / present).read_bytes() == b"the user's own"


def test_the_trainer_gets_the_counted_gpus_and_the_data_it_made(tmp_path):
    data = tmp_path / "data"
    done = run(tmp_path, "--cfg", "job", nvidia_smi=TWO_GPUS, DATA=str(data))
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(os.listdir(data)) == ["test.parquet", "train.parquet"]
    assert "n_gpus_per_node: 2\n" in done.stdout and "default_agent_loop: threadweaver\n" in done.stdout
    assert f"train_files: {data}/train.parquet\n" in done.stdout
    made = {name: (data / name).stat().st_mtime_ns for name in os.listdir(data)}
    again = run(tmp_path, "--cfg", "job", NGPUS="03", DATA=str(data))  # both present: kept as they are
    assert again.returncode == 0 and "n_gpus_per_node: 3\n" in again.stdout
    assert {name: (data / name).stat().st_mtime_ns for name in os.listdir(data)} == made
