"""Where a trajectory's wall-clock went: its main sequence's time cut into phases that add up.

Token latency counts tokens on the critical path; users pay seconds. Along the main sequence,
a trajectory alternates requests and blocks, so its time from start to its last reply splits
into parts that sum to it exactly:

- ``prefill_s``: the main sequence's requests waiting for their first token (queue and
  prefill), except after a join;
- ``join_s``: the same for the request that continues after a block: the prefill of every
  thread's text that the engine's prefix cache did not hold;
- ``sequential_s`` and ``heads_s``: the rest of the main sequence's requests, decoding; the
  share that wrote a block's head (``<Parallel>`` to ``</Outlines>``) is apportioned by tokens;
- ``threads_s``: each block from its first thread's start to its last thread's end (nested
  blocks included);
- ``client_s``: no request of the main sequence in flight: between an engine's reply and the
  next request (the orchestrator, the client, the network).

Where first-token times are unknown (an engine that neither streams nor reports them),
``timed`` is false and the waits count as decoding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from threadweaver.orchestrator import RequestRecord, Trajectory
from threadweaver.tree import Block


@dataclass(frozen=True)
class BlockTime:
    head_s: float
    threads_s: float
    join_s: float


@dataclass(frozen=True)
class WallClock:
    total_s: float
    """The trajectory's start to its last reply: the sum of the parts below."""
    prefill_s: float
    sequential_s: float
    heads_s: float
    threads_s: float
    join_s: float
    client_s: float
    timed: bool
    """Every main-sequence request has its first-token time: waits are told from decoding."""
    blocks: tuple[BlockTime, ...] = ()

    PARTS = ("prefill_s", "sequential_s", "heads_s", "threads_s", "join_s", "client_s")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def wall_clock(trajectory: Trajectory) -> WallClock:
    """The trajectory's wall-clock in phases (see the module's docstring)."""
    heads = [len(n.head) for n in trajectory.nodes if isinstance(n, Block)]
    return phases(trajectory.requests, heads)


def phases(requests: Sequence[RequestRecord], heads: Sequence[int]) -> WallClock:
    """``requests`` of one trajectory; ``heads``: the head length of each forked block of its main
    sequence, in order."""
    main = sorted((r for r in requests if not r.thread_path), key=lambda r: r.started)
    threads: dict[int, list[RequestRecord]] = {}
    for r in requests:
        if r.thread_path:
            threads.setdefault(r.thread_path[0][0], []).append(r)
    spans = [(min(r.started for r in rs), max(r.ended for r in rs)) for _, rs in sorted(threads.items())]
    parts = dict.fromkeys(WallClock.PARTS, 0.0)
    blocks: list[BlockTime] = []
    now, joined = 0.0, False
    for i, request in enumerate(main):
        parts["client_s"] += max(request.started - now, 0.0)
        first = request.started if request.first_token is None else min(request.first_token, request.ended)
        parts["join_s" if joined else "prefill_s"] += first - request.started
        if joined:
            blocks[-1] = dataclasses.replace(blocks[-1], join_s=first - request.started)
        decoding = request.ended - first
        now, joined = request.ended, False
        after = main[i + 1].started if i + 1 < len(main) else float("inf")
        if len(blocks) < len(spans) and request.ended <= spans[len(blocks)][0] < after:  # it wrote a head
            start, end = spans[len(blocks)]
            head_tokens = min(heads[len(blocks)] if len(blocks) < len(heads) else 0, request.completion_tokens)
            head_s = decoding * head_tokens / max(request.completion_tokens, 1)
            parts["heads_s"] += head_s
            parts["client_s"] += start - now
            parts["threads_s"] += end - start
            blocks.append(BlockTime(head_s, end - start, 0.0))
            decoding -= head_s
            now, joined = end, True
        parts["sequential_s"] += decoding
    timed = all(r.first_token is not None for r in main)
    return WallClock(now, **parts, timed=timed, blocks=tuple(blocks))


def mean_parts(clocks: Sequence[dict]) -> dict[str, float]:
    """The mean of each part (and of ``total_s``) over :meth:`WallClock.as_dict` rows."""
    names = ("total_s", *WallClock.PARTS)
    return {name: sum(c[name] for c in clocks) / len(clocks) for name in names} if clocks else {}


def format_parts(means: dict[str, float]) -> str:
    """``"2.31 s = sequential 0.80 + heads 0.10 + threads 1.10 + join 0.20 + prefill 0.05 + client 0.06"``."""
    parts = " + ".join(f"{name.removesuffix('_s')} {means[name]:.2f}" for name in WallClock.PARTS)
    return f"{means['total_s']:.2f} s = {parts}"
