"""Decoding many prompts: bounded concurrency, per-sample seeds, JSONL out, resumable.

Each finished trajectory is appended and flushed at once, so a crash loses only the
trajectories still in flight; rerunning skips every (row id, sample) already written.
The engine and the tokenizer are passed in: this module does no host I/O itself.
:func:`run_sync` is the one bridge from synchronous hosts (TRL, lm-eval, the command
line) to the asynchronous orchestrator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from threadweaver.cli_args import option
from threadweaver.format import Format
from threadweaver.interrupts import run_until_complete
from threadweaver.jsonl import RowError, appending, read_jsonl, row_name
from threadweaver.orchestrator import Limits, Orchestrator, Sampling, Trajectory
from threadweaver.rows import RowReader, tokenizer_field
from threadweaver.tree import tree_json
from threadweaver.wall_clock import format_parts, mean_parts, wall_clock


@dataclass(frozen=True)
class Job:
    row_id: str
    sample: int
    prompt_ids: tuple[int, ...]
    row: dict


def read_problems(path: str) -> list[tuple[int, str, dict]]:
    """(line, id, row) per problem; a line that is not a JSON object, or repeats an id, raises
    :class:`RowError` naming it. Needs no tokenizer, so a bad file is refused before any work."""
    seen: set[str] = set()
    problems = []
    for line, row in read_jsonl(path):
        row_id = row_name(row, line)
        if row_id in seen:
            raise RowError(line, f"duplicate id {row_id!r}; ids must be unique for resuming")
        seen.add(row_id)
        problems.append((line, row_id, row))
    return problems


def problem_jobs(problems: list[tuple[int, str, dict]], tokenizer: Any, samples: int) -> Iterator[Job]:
    """One job per (problem, sample); a row without a usable prompt raises :class:`RowError` naming its line."""
    reader = RowReader(tokenizer)
    for line, row_id, row in problems:
        try:
            ids = tuple(reader.prompt(row))
        except ValueError as err:
            raise RowError.at(line, err) from None
        for sample in range(samples):
            yield Job(row_id, sample, ids, row)


SAMPLING_FIELD = "sampling"
"""A batch row's sampling settings (:class:`~threadweaver.engine.Sampling`), which a resumed run must share."""


def check_same_sampling(path: str, sampling: Sampling) -> None:
    """Refuse to resume ``path`` with other sampling settings than its finished rows record (the ``seed`` each
    sample's own is made from): the two kinds of sample would mix in one file, past telling apart. Rows written
    before rows recorded them are taken."""
    from threadweaver.cli_args import flag
    from threadweaver.jsonl import read_jsonl

    recorded = next((row[SAMPLING_FIELD] for _, row in read_jsonl(path) if SAMPLING_FIELD in row), None)
    if not isinstance(recorded, dict):
        return
    now = dataclasses.asdict(sampling)
    changed = [key for key, value in now.items() if key in recorded and recorded[key] != value]

    def said(settings: dict) -> str:
        return ", ".join(
            f"no {flag(key)}" if settings[key] is None else f"{flag(key)} {settings[key]}" for key in changed
        )

    if changed:
        raise ValueError(
            f"{path}: its rows were sampled with {said(recorded)}, and this run's {said(now)}: resuming would mix "
            "the two in one file; give the same flags to go on, or name a new OUT"
        )


def trajectory_row(trajectory: Trajectory, fmt: Format, wall_s: float, limits: Limits, **head) -> dict:
    """A finished trajectory as a JSONL row: ``head`` (its id, sample, ...), then what the orchestrator recorded."""
    return {
        **head,
        **tokenizer_field(fmt),
        "concurrent_threads": limits.concurrent_threads,
        "text": fmt.decode(trajectory.token_ids),
        "prompt_ids": list(trajectory.prompt_ids),
        "token_ids": list(trajectory.token_ids),
        "injected": [i for i, g in enumerate(trajectory.generated) if not g],
        "tree": tree_json(trajectory.nodes, fmt),
        "requests": [dataclasses.asdict(r) for r in trajectory.requests],
        "stats": trajectory.stats.as_dict(),
        "degradations": [d.as_dict() for d in trajectory.degradations],
        "finish_reason": trajectory.finish_reason,
        "wall_s": wall_s,
        "wall_clock": wall_clock(trajectory).as_dict(),
    }


@dataclass
class BatchProgress:
    """Running totals, for a progress bar."""

    done: int = 0
    generated_tokens: int = 0
    speedup_sum: float = 0.0
    degraded: int = 0
    kinds: Counter = dataclasses.field(default_factory=Counter)
    """Trajectories with at least one degradation, per kind."""
    finish_reasons: Counter = dataclasses.field(default_factory=Counter)
    """Trajectories per :attr:`Trajectory.finish_reason`."""
    started: float = dataclasses.field(default_factory=time.monotonic)
    clocks: list[dict] = dataclasses.field(default_factory=list)

    def add(self, trajectory: Trajectory) -> None:
        self.clocks.append(wall_clock(trajectory).as_dict())
        self.done += 1
        self.generated_tokens += trajectory.stats.total_tokens
        self.speedup_sum += trajectory.stats.speedup
        self.degraded += not trajectory.well_formed
        self.kinds.update(trajectory.degradation_kinds)
        self.finish_reasons[trajectory.finish_reason] += 1

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / max(time.monotonic() - self.started, 1e-9)

    @property
    def mean_speedup(self) -> float:
        return self.speedup_sum / self.done if self.done else 0.0

    def degraded_by_kind(self) -> str:
        """``"3 degraded (bad_outlines 2, eos_in_thread 1)"``."""
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.kinds.items()))
        return f"{self.degraded} degraded" + (f" ({kinds})" if kinds else "")

    def cut_short(self) -> str:
        """``"2 cut short (finish_reason length 1, timeout 1)"``: trajectories that did not end at EOS;
        ``""`` if none."""
        cut = {reason: n for reason, n in self.finish_reasons.items() if reason != "stop"}
        if not cut:
            return ""
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(cut.items()))
        return f"{sum(cut.values())} cut short (finish_reason {reasons})"

    def wall_clock(self) -> str:
        """Where a trajectory's seconds went, on average (see :mod:`threadweaver.wall_clock`)."""
        return format_parts(mean_parts(self.clocks))

    def postfix(self) -> str:
        """The progress bar's description of the run so far."""
        return f"{self.tokens_per_s:.0f} tok/s, mean speedup {self.mean_speedup:.2f}x, degraded {self.degraded}"


def concurrency_option():
    """``--concurrency`` of what decodes many prompts (generate, self-train, lm-eval's model): ``decode_many``'s."""
    return option(32, "Trajectories decoded at once.")


async def decode_many(
    orchestrator: Orchestrator,
    prompts: Sequence[Sequence[int]],
    *,
    concurrency: int,
    seed: int | None = None,
    samples: Sequence[int] | None = None,
) -> AsyncIterator[tuple[int, Trajectory, float]]:
    """Decode ``prompts``, ``concurrency`` at a time: (index, trajectory, wall seconds) as each finishes.

    With ``seed``, prompt ``i`` is drawn with seed ``seed + samples[i]`` (its sample number,
    0 by default). The first engine error cancels the rest and is raised after every
    trajectory that finished with it.
    """
    slots = asyncio.Semaphore(concurrency)
    base = orchestrator.sampling

    async def one(index: int) -> tuple[int, Trajectory, float]:
        async with slots:
            sample = samples[index] if samples is not None else 0
            sampling = base if seed is None else dataclasses.replace(base, seed=seed + sample)
            started = time.monotonic()
            trajectory = await orchestrator.run(prompts[index], sampling)
            return index, trajectory, time.monotonic() - started

    pending = {asyncio.ensure_future(one(i)) for i in range(len(prompts))}
    error: BaseException | None = None
    try:
        while pending and error is None:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:  # hand over every finished trajectory, even when another one failed
                if task.exception() is not None:
                    error = error or task.exception()
                    continue
                yield task.result()
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    if error is not None:
        raise error


async def run_batch(
    jobs: list[Job],
    orchestrator: Orchestrator,
    out_path: str,
    *,
    concurrency: int,
    seed: int | None = None,
    on_done: Callable[[BatchProgress], None] | None = None,
) -> BatchProgress:
    """Decode ``jobs`` (see :func:`decode_many`), appending each trajectory to ``out_path`` as it finishes."""
    progress = BatchProgress()
    sampling = dataclasses.asdict(orchestrator.sampling)
    prompts, samples = [job.prompt_ids for job in jobs], [job.sample for job in jobs]
    with appending(out_path) as append:
        async for i, trajectory, wall_s in decode_many(
            orchestrator, prompts, concurrency=concurrency, seed=seed, samples=samples
        ):
            job = jobs[i]
            answer = {"answer": job.row["answer"]} if "answer" in job.row else {}
            head = {"id": job.row_id, "sample": job.sample, **answer, SAMPLING_FIELD: sampling}
            append(trajectory_row(trajectory, orchestrator.fmt, wall_s, orchestrator.limits, **head))
            progress.add(trajectory)
            if on_done:
                on_done(progress)
    return progress


_loops = threading.local()
_worker: ThreadPoolExecutor | None = None


def run_sync(coroutine):
    """Run ``coroutine`` to the end from synchronous code and return its result.

    Each thread keeps one event loop between calls, so what an engine binds to it (an
    HTTP session) serves every call. Called inside a running loop (a notebook), the
    coroutine runs on a worker thread of its own. On the main thread Ctrl-C (and SIGTERM or
    SIGHUP where :func:`~threadweaver.interrupts.interrupt_like_ctrl_c` asked) cancels it, and
    KeyboardInterrupt is raised once it has unwound.
    """
    global _worker
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = getattr(_loops, "loop", None)
        if loop is None or loop.is_closed():
            loop = _loops.loop = asyncio.new_event_loop()
        return run_until_complete(loop, coroutine)
    _worker = _worker or ThreadPoolExecutor(1, thread_name_prefix="threadweaver-run-sync")
    return _worker.submit(run_sync, coroutine).result()
