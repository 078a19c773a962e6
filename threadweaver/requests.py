"""The (context, completion) requests that the inference state machine issues.

For a trajectory the orchestrator issues, in this order:

1. a sequential request that generates up to and including ``</Outlines>``;
2. per thread ``i``, a request whose context is everything so far plus the injected
   seed ``<Thread>`` + ``"i:"``, generating up to and including ``</Thread>``
   (recursively, if the thread opens a nested block);
3. after the join, a continuation request whose context is the joined trajectory plus
   the injected ``</Parallel>``.

The last request's context + completion is always the whole prompt + trajectory.
:func:`plan_requests` derives them from the trajectory's layout
(:mod:`threadweaver.layout`), the walk that rendering, the statistics and the trie use
too; tests hold the orchestrator, SFT and RL rows against it, and benches count the
tokens of the unshared layout with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from threadweaver.format import Format
from threadweaver.layout import ThreadPath, spans
from threadweaver.tree import Node

Stop = Literal["outlines", "thread", "end"]


@dataclass(frozen=True)
class Request:
    context: tuple[int, ...]
    completion: tuple[int, ...]
    thread_path: ThreadPath
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
    layout = list(spans(nodes, fmt.tags))
    trajectory = tuple(i for span in layout for i in span.ids)
    generated = tuple(span.generated for span in layout for _ in span.ids)
    requests: list[Request] = []
    # Per open sequence: the trajectory spans in its current request's context, and where
    # that request's completion starts. Per open block: its parent's context at the fork.
    sequences: list[tuple[list[tuple[int, int]], int]] = [([], 0)]
    forks: list[list[tuple[int, int]]] = []

    def emit(end: int, path: ThreadPath, stop: Stop) -> None:
        context, start = sequences[-1]
        ids = prompt + tuple(i for a, b in context for i in trajectory[a:b])
        requests.append(Request(ids, trajectory[start:end], path, stop, start))

    for span in layout:
        end = span.start + len(span.ids)
        if span.kind == "head":
            emit(end, span.path, "outlines")
            forks.append(_joined(sequences[-1][0], (sequences[-1][1], end)))
        elif span.kind == "seed":
            sequences.append((_joined(forks[-1], (span.start - 1, end)), end))
        elif span.kind == "close":
            emit(end, span.path, "thread")
            sequences.pop()
        elif span.kind == "join":
            fork = forks.pop()
            sequences[-1] = (_joined(fork, (fork[-1][1], end)), end)
    emit(len(trajectory), (), "end")
    return RequestPlan(prompt, trajectory, generated, tuple(requests))


def _joined(spans: list[tuple[int, int]], span: tuple[int, int]) -> list[tuple[int, int]]:
    """``spans`` + ``span``, merging it into the last span when they touch."""
    if spans and spans[-1][1] == span[0]:
        return spans[:-1] + [(spans[-1][0], span[1])]
    return spans + [span]
