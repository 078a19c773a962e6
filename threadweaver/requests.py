"""The (context, completion) requests that the inference state machine issues.

This is the single source of truth shared by inference, SFT and RL. For a trajectory
the orchestrator issues, in this order:

1. a sequential request that generates up to and including ``</Outlines>``;
2. per thread ``i``, a request whose context is everything so far plus the injected
   seed ``<Thread>`` + ``"i:"``, generating up to and including ``</Thread>``
   (recursively, if the thread opens a nested block);
3. after the join, a continuation request whose context is the joined trajectory plus
   the injected ``</Parallel>``.

The last request's context + completion is always the whole prompt + trajectory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from threadweaver.format import Format
from threadweaver.tree import Node, Text, render

Stop = Literal["outlines", "thread", "end"]


@dataclass(frozen=True)
class Request:
    context: tuple[int, ...]
    completion: tuple[int, ...]
    thread_path: tuple[tuple[int, int], ...]
    """(block index, thread number) per level, from the top down: ``()`` is the main
    sequence, ``((0, 2), (1, 1))`` is thread 1 of the second block inside thread 2 of
    the first top-level block. Block indices count blocks within one sequence."""
    stop: Stop
    """What ended the completion: ``</Outlines>``, ``</Thread>``, or the trajectory's end."""
    start: int
    """Trajectory position of the first completion token."""


@dataclass(frozen=True)
class RequestPlan:
    prompt: tuple[int, ...]
    trajectory: tuple[int, ...]
    generated: tuple[bool, ...]
    """Per trajectory token: True if the model generated it, False if the orchestrator
    injected it (``<Thread>`` and the seed of every thread, and every ``</Parallel>``)."""
    requests: tuple[Request, ...]

    @property
    def expanded_tokens(self) -> int:
        """Tokens in one row per request (context + completion), the unshared layout."""
        return sum(len(r.context) + len(r.completion) for r in self.requests)


def plan_requests(prompt: Sequence[int], nodes: Sequence[Node], fmt: Format) -> RequestPlan:
    """All requests the orchestrator issues for ``prompt`` followed by tree ``nodes``."""
    prompt = tuple(prompt)
    trajectory = tuple(render(nodes, fmt))
    generated = [True] * len(trajectory)
    requests: list[Request] = []

    def tokens(spans: list[tuple[int, int]]) -> tuple[int, ...]:
        out = list(prompt)
        for start, end in spans:
            out.extend(trajectory[start:end])
        return tuple(out)

    def emit(spans, start, end, path, stop):
        requests.append(Request(tokens(spans), trajectory[start:end], path, stop, start))

    def run(spans: list[tuple[int, int]], nodes: Sequence[Node], pos: int, path: tuple) -> int:
        """Walk one sequence from trajectory position ``pos``; return where it ends."""
        start, block_index = pos, -1
        for node in nodes:
            if isinstance(node, Text):
                pos += len(node.ids)
                continue
            block_index += 1
            pos += len(node.head)
            emit(spans, start, pos, path, "outlines")
            base = _joined(spans, (start, pos))
            for thread in node.threads:
                seed_start = pos
                pos += 1 + len(thread.seed)
                generated[seed_start:pos] = [False] * (pos - seed_start)
                pos = run(_joined(base, (seed_start, pos)), thread.body, pos, path + ((block_index, thread.number),))
            generated[pos] = False
            pos += 1
            spans, start = _joined(base, (base[-1][1], pos)), pos
        if path:
            pos += 1
        emit(spans, start, pos, path, "thread" if path else "end")
        return pos

    end = run([], nodes, 0, ())
    assert end == len(trajectory)
    return RequestPlan(prompt, trajectory, tuple(generated), tuple(requests))


def _joined(spans: list[tuple[int, int]], span: tuple[int, int]) -> list[tuple[int, int]]:
    """``spans`` + ``span``, merging it into the last span when they touch."""
    if spans and spans[-1][1] == span[0]:
        return spans[:-1] + [(spans[-1][0], span[1])]
    return spans + [span]
