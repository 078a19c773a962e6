"""Serve the models and evaluate each decoding mode with the real ``lm_eval`` CLI.

Each mode is one ``lm_eval run --model threadweaver --tasks TASK`` in a subprocess; its
log goes to a file, and a progress bar follows the trajectories the model appends
(``--model_args trajectories=...``) as each one finishes.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from threadweaver.jsonl import read_jsonl


@dataclass(frozen=True)
class Mode:
    key: str
    label: str
    model: str
    """Which model decodes: ``"parallel"``, ``"baseline"`` or one of the ``--pgrpo`` pair."""
    branching: bool
    concurrent_threads: bool = True


MODES = (
    Mode("fork_join", "ThreadWeaver, fork-join", "parallel", branching=True),
    Mode("one_after_another", "same tokens, threads one after another", "parallel", True, concurrent_threads=False),
    Mode("baseline", "sequential baseline model", "baseline", branching=False),
    Mode("half_parallel", "half-parallel SFT, fork-join", "half_parallel", branching=True),
    Mode("half_parallel_pgrpo", "half-parallel SFT + P-GRPO, fork-join", "half_parallel_pgrpo", branching=True),
)


@dataclass(frozen=True)
class Endpoint:
    """Where a model is decoded: a server URL, or an in-process engine over a model directory."""

    engine: str
    base_url: str | None = None
    model: str | None = None

    def model_args(self) -> dict:
        args = {"engine": self.engine}
        if self.base_url:
            args["base_url"] = self.base_url
        if self.model and not self.base_url:
            args["model"] = self.model
        return args


SHORT_CONTEXT = 2048
"""The context of the pairs trained here: their problems and solutions fit it (and a 1 GiB CPU KV cache)."""


@contextmanager
def served(
    models: dict[str, str], log_dir: Path, dtype: str, max_model_len: int = SHORT_CONTEXT
) -> Iterator[dict[str, Endpoint]]:
    """One vLLM server per model directory, started side by side, sharing the GPU if there is one; stopped on exit."""
    from concurrent.futures import ThreadPoolExecutor

    from threadweaver.vllm_orchestrator.serve import VLLMServer

    log_dir.mkdir(parents=True, exist_ok=True)
    servers = {
        name: VLLMServer(args, log_path=str(log_dir / f"server-{name}.log"))
        for name, args in server_args(models, dtype, max_model_len).items()
    }
    with ExitStack() as stack:
        for server in servers.values():
            stack.callback(server.stop)
        pool = ThreadPoolExecutor(len(servers) or 1)
        try:
            for future in [pool.submit(server.start) for server in servers.values()]:
                future.result()
        except BaseException:  # a failed start, or the command stopped: the others stop now, not once up
            for server in servers.values():
                server.stop()
            raise
        finally:
            pool.shutdown()
        yield {name: Endpoint("vllm", base_url=server.url) for name, server in servers.items()}


def server_args(models: dict[str, str], dtype: str, max_model_len: int):
    """Each model's server settings: on a GPU, vLLM's share of its memory is of the whole GPU, so the servers
    split the default share."""
    from threadweaver.vllm_orchestrator.serve import ServeArgs, cpu_kv_cache_of_our_own

    share = round(ServeArgs.gpu_memory_utilization / max(len(models), 1), 2)
    settings = {"port": 0, "max_model_len": max_model_len, "dtype": dtype, "gpu_memory_utilization": share}
    if max_model_len <= SHORT_CONTEXT:
        settings["cpu_kv_cache_gib"] = cpu_kv_cache_of_our_own(1)  # a short window's cache on CPU (2 GiB, beyond)
    return {name: ServeArgs(path, **settings) for name, path in models.items()}


def check_task(task: str) -> None:
    """Refuse a task lm-eval does not know now, not after the servers have started (10 s: every task's YAML)."""
    from lm_eval.tasks import TaskManager

    if os.path.exists(task):  # a task's YAML file or folder, which lm-eval takes as it is
        return
    known = TaskManager().all_tasks
    if task not in known:
        close = difflib.get_close_matches(task, known, n=3)
        raise ValueError(
            f"--task {task}: lm-eval knows no such task" + (f" (did you mean {', '.join(close)}?)" if close else "")
        )


def task_size(task: str) -> int | None:
    """How many problems one of threadweaver's synthetic tasks holds (their YAML says), or None for another task,
    or one read from a local file (``THREADWEAVER_TW_SYNTH_FILE``, say)."""
    import yaml

    from threadweaver.lmeval_tasks.data import local_file, synth_size
    from threadweaver.lmeval_tasks.discovery import TASKS_DIR

    path = TASKS_DIR / f"{task}.yaml"
    if not path.is_file():
        return None
    kwargs = yaml.safe_load(path.read_text()).get("dataset_kwargs") or {}
    try:
        if "synth" not in kwargs or local_file(kwargs["benchmark"], {}) is not None:
            return None
    except FileNotFoundError:  # lm-eval says so
        return None
    return synth_size(kwargs["synth"])


def lm_eval_command(task: str, model_args: dict, out: Path, limit: int | None) -> list[str]:
    joined = ",".join(f"{key}={value}" for key, value in model_args.items())
    command = [sys.executable, "-m", "lm_eval", "run", "--model", "threadweaver", "--model_args", joined]
    command += ["--tasks", task, "--output_path", str(out), "--log_samples"]
    return command + (["--limit", str(limit)] if limit else [])


def read_lm_eval_output(out: Path) -> dict:
    """The newest results JSON under ``out``, with ``samples[task]`` (sorted by doc id) from its sample files."""
    results_paths = sorted(out.rglob("results_*.json"), key=os.path.getmtime)
    if not results_paths:
        raise FileNotFoundError(f"lm_eval wrote no results_*.json under {out}")
    results = json.loads(results_paths[-1].read_text())
    stamp = results_paths[-1].name[len("results_") : -len(".json")]
    results["samples"] = {}
    for path in out.rglob(f"samples_*_{stamp}.jsonl"):
        task = path.name[len("samples_") : -len(f"_{stamp}.jsonl")]
        rows = [row for _, row in read_jsonl(str(path))]
        results["samples"][task] = sorted(rows, key=lambda row: row["doc_id"])
    return results


def evaluate(
    mode: Mode, endpoint: Endpoint, task: str, out: Path, *, limit: int | None, concurrency: int, expected: int | None
) -> tuple[dict, list[dict]]:
    """Run one mode through ``lm_eval``: (its results with samples, its trajectories)."""
    from tqdm import tqdm

    run_dir = out / mode.key
    trajectories = run_dir / "trajectories.jsonl.partial"  # an earlier run's stay until this one's are whole
    log_path = run_dir / "lm_eval.log"
    run_dir.mkdir(parents=True, exist_ok=True)
    trajectories.unlink(missing_ok=True)
    model_args = {
        **endpoint.model_args(),
        "branching": mode.branching,
        "concurrent_threads": mode.concurrent_threads,
        "concurrency": concurrency,
        "trajectories": trajectories,
    }
    command = lm_eval_command(task, model_args, run_dir / "lm_eval", limit)
    with (
        open(log_path, "w") as log,
        tqdm(total=expected, desc=f"      {mode.label}", unit=" problems", dynamic_ncols=True) as bar,
    ):
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        while process.poll() is None:
            time.sleep(0.5)
            if (done := _count_lines(trajectories)) > bar.n:
                bar.update(done - bar.n)
    if process.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(
            f"lm_eval failed with exit code {process.returncode} ({' '.join(command)}); its log is {log_path}:\n{tail}"
        )
    rows = [row for _, row in read_jsonl(str(trajectories))] if trajectories.exists() else []
    output = read_lm_eval_output(run_dir / "lm_eval")
    if trajectories.exists():
        trajectories.replace(run_dir / "trajectories.jsonl")
    return output, rows


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0
