"""Batch decoding: JSONL problems in, JSONL trajectories out, resumable.

Each finished trajectory is appended and flushed at once, so a crash loses only the
trajectories still in flight; rerunning skips every (row id, sample) already written.
The engine and the tokenizer are passed in: this module does no host I/O itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from threadweaver.format import Format
from threadweaver.orchestrator import Orchestrator, Trajectory
from threadweaver.report import RowError, read_jsonl
from threadweaver.tree import tree_json


@dataclass(frozen=True)
class Job:
    row_id: str
    sample: int
    prompt_ids: tuple[int, ...]
    row: dict


def prompt_ids(row: dict, tokenizer: Any) -> list[int]:
    """The prompt of a problem row: ``prompt_ids``, ``messages`` or ``prompt``.

    ``messages`` are rendered with the chat template and the generation prompt; a
    trailing assistant turn (a reference solution) is left out. A ``prompt`` string is
    one user turn through the chat template, or verbatim if the tokenizer has none.
    """
    if "prompt_ids" in row:
        ids = row["prompt_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise ValueError("field 'prompt_ids' must be a non-empty list of token ids")
        return ids
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError("field 'messages' must be a list of {role, content} turns")
        while messages and messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        if not messages:
            raise ValueError("field 'messages' has no turn before the assistant's")
        return chat_prompt_ids(tokenizer, messages)
    if "prompt" in row:
        prompt = row["prompt"]
        if isinstance(prompt, list):
            return chat_prompt_ids(tokenizer, prompt)
        if not isinstance(prompt, str):
            raise ValueError("field 'prompt' must be a string or a list of messages")
        if getattr(tokenizer, "chat_template", None):
            return chat_prompt_ids(tokenizer, [{"role": "user", "content": prompt}])
        return tokenizer.encode(prompt, add_special_tokens=False)
    raise ValueError("no prompt: expected 'messages', 'prompt' or 'prompt_ids'")


def chat_prompt_ids(tokenizer: Any, messages: list[dict], **template_kwargs) -> list[int]:
    """``messages`` through the chat template, with the generation prompt, as token ids."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


def read_jobs(path: str, tokenizer: Any, samples: int) -> Iterator[Job]:
    """One job per (row, sample); a bad row raises :class:`RowError` naming its line."""
    seen: set[str] = set()
    for line, row in read_jsonl(path):
        row_id = str(row.get("id", f"line-{line}"))
        if row_id in seen:
            raise RowError(line, f"duplicate id {row_id!r}; ids must be unique for resuming")
        seen.add(row_id)
        try:
            ids = tuple(prompt_ids(row, tokenizer))
        except ValueError as err:
            raise RowError(line, str(err)) from None
        for sample in range(samples):
            yield Job(row_id, sample, ids, row)


def finished_keys(path: str) -> set[tuple[str, int]]:
    """(id, sample) of rows already in ``path``; a torn last line (a crash mid-write) is cut off."""
    if not os.path.exists(path):
        return set()
    keys = set()
    good = 0
    with open(path, "rb") as f:
        for line in f:
            try:
                row = json.loads(line)
                keys.add((row["id"], row["sample"]))
            except (ValueError, KeyError, TypeError):
                break
            if not line.endswith(b"\n"):
                break
            good += len(line)
    if good < os.path.getsize(path):
        with open(path, "r+b") as f:
            f.truncate(good)
    return keys


def trajectory_row(job: Job, trajectory: Trajectory, fmt: Format, wall_s: float) -> dict:
    row = {"id": job.row_id, "sample": job.sample}
    if "answer" in job.row:
        row["answer"] = job.row["answer"]
    row.update(
        {
            "text": fmt.decode(trajectory.token_ids),
            "prompt_ids": list(job.prompt_ids),
            "token_ids": list(trajectory.token_ids),
            "injected": [i for i, g in enumerate(trajectory.generated) if not g],
            "tree": tree_json(trajectory.nodes, fmt),
            "requests": [dataclasses.asdict(r) for r in trajectory.requests],
            "stats": trajectory.stats.as_dict(),
            "problems": list(trajectory.problems),
            "finish_reason": trajectory.finish_reason,
            "wall_s": wall_s,
        }
    )
    return row


@dataclass
class BatchProgress:
    """Running totals, for a progress bar."""

    done: int = 0
    generated_tokens: int = 0
    speedup_sum: float = 0.0
    degraded: int = 0
    started: float = dataclasses.field(default_factory=time.monotonic)

    def add(self, trajectory: Trajectory) -> None:
        self.done += 1
        self.generated_tokens += trajectory.stats.total_tokens
        self.speedup_sum += trajectory.stats.speedup
        self.degraded += trajectory.degraded

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / max(time.monotonic() - self.started, 1e-9)

    @property
    def mean_speedup(self) -> float:
        return self.speedup_sum / self.done if self.done else 0.0


async def decode_jobs(
    jobs: Iterable[Job], orchestrator: Orchestrator, *, concurrency: int, seed: int | None = None
) -> AsyncIterator[tuple[Job, Trajectory, float]]:
    """Decode ``jobs``, ``concurrency`` trajectories at a time: (job, trajectory, wall seconds) as each finishes.

    With ``seed``, sample ``k`` is drawn with seed ``seed + k``. The first engine error
    cancels the rest and is raised after every trajectory that finished with it.
    """
    slots = asyncio.Semaphore(concurrency)
    base = orchestrator.sampling

    async def one(job: Job) -> tuple[Job, Trajectory, float]:
        async with slots:
            sampling = base if seed is None else dataclasses.replace(base, seed=seed + job.sample)
            started = time.monotonic()
            trajectory = await orchestrator.run(job.prompt_ids, sampling)
            return job, trajectory, time.monotonic() - started

    pending = {asyncio.ensure_future(one(job)) for job in jobs}
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
    """Decode ``jobs`` (see :func:`decode_jobs`), appending each trajectory to ``out_path`` as it finishes."""
    progress = BatchProgress()
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(out_path, "a", encoding="utf-8") as out:
        async for job, trajectory, wall_s in decode_jobs(jobs, orchestrator, concurrency=concurrency, seed=seed):
            out.write(json.dumps(trajectory_row(job, trajectory, orchestrator.fmt, wall_s)) + "\n")
            out.flush()
            progress.add(trajectory)
            if on_done:
                on_done(progress)
    return progress
