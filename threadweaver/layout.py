"""The one walk over a trajectory's layout: how a fork-join tree lies out as tokens.

A block lies out as its head (``<Parallel>`` through ``</Outlines>``, generated); then,
per thread, the injected ``<Thread>`` and seed ``"i:"``, the thread's body and its
``</Thread>`` (generated, unless the orchestrator closed the thread); then the injected
``</Parallel>``. :func:`spans` yields that layout in token order as typed spans, and
everything that needs it consumes them: :func:`render`, the
orchestrator's generated flags, :func:`threadweaver.stats.latency_stats`,
:func:`threadweaver.requests.plan_requests` and :class:`threadweaver.trie.TokenTrie`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from threadweaver.format import Format, TagIds
from threadweaver.tree import Block, Node, Text

ThreadPath = tuple[tuple[int, int], ...]
"""(block index, thread number) per level, from the top down: ``()`` is the main sequence,
``((0, 2), (1, 1))`` is thread 1 of the second block inside thread 2 of the first
top-level block. Block indices count the blocks of one sequence."""

Kind = Literal["text", "head", "open", "seed", "close", "join"]
"""``text``: sequential tokens; ``head``: ``<Parallel>`` .. ``</Outlines>``; ``open``: a
thread's ``<Thread>``; ``seed``: its ``"i:"``; ``close``: its ``</Thread>``; ``join``:
the block's ``</Parallel>``."""


def thread_name(path: ThreadPath) -> str:
    """``"thread 2.1"`` for a thread path, ``"main sequence"`` for the main sequence."""
    return "thread " + ".".join(str(number) for _, number in path) if path else "main sequence"


@dataclass(frozen=True)
class Span:
    kind: Kind
    ids: tuple[int, ...]
    path: ThreadPath
    """The sequence the span belongs to; a thread's ``open``, ``seed`` and ``close`` carry
    the thread's own path."""
    generated: bool
    """False where the orchestrator injected the tokens."""
    start: int
    """Trajectory position of the first token."""


def spans(nodes: Sequence[Node], tags: TagIds, closed_threads: Collection[ThreadPath] = ()) -> Iterator[Span]:
    """The layout of ``nodes`` as spans, in token order.

    ``closed_threads``: paths of threads whose ``</Thread>`` the orchestrator injected
    (:attr:`threadweaver.orchestrator.Trajectory.closed_threads`).
    """
    position = 0

    def walk(sequence: Sequence[Node], path: ThreadPath) -> Iterator[Span]:
        nonlocal position
        block_index = 0
        for node in sequence:
            if isinstance(node, Text):
                yield Span("text", node.ids, path, True, position)
                position += len(node.ids)
                continue
            yield Span("head", node.head, path, True, position)
            position += len(node.head)
            for thread in node.threads:
                thread_path = (*path, (block_index, thread.number))
                yield Span("open", thread_open(tags), thread_path, False, position)
                yield Span("seed", thread.seed, thread_path, False, position + 1)
                position += 1 + len(thread.seed)
                yield from walk(thread.body, thread_path)
                yield Span("close", thread_close(tags), thread_path, thread_path not in closed_threads, position)
                position += 1
            yield Span("join", block_join(tags), path, False, position)
            position += 1
            block_index += 1

    yield from walk(nodes, ())


def thread_open(tags: TagIds) -> tuple[int, ...]:
    """A thread's ``open`` span: ``<Thread>``, injected."""
    return (tags.thread,)


def thread_close(tags: TagIds) -> tuple[int, ...]:
    """A thread's ``close`` span: ``</Thread>``, generated unless the orchestrator closed it."""
    return (tags.thread_end,)


def block_join(tags: TagIds) -> tuple[int, ...]:
    """A block's ``join`` span: ``</Parallel>``, injected."""
    return (tags.parallel_end,)


def thread_opening(tags: TagIds, seed: tuple[int, ...]) -> tuple[int, ...]:
    """What the orchestrator injects to open a thread: its ``open`` and ``seed`` spans."""
    return (*thread_open(tags), *seed)


def block_tail(block: Block, tags: TagIds, *, joined: bool = True) -> list[int]:
    """The layout of ``block`` after its head: each thread opened, seeded, its body and closed,
    then the join (without it where not ``joined``: the context of a join still to come)."""
    ids: list[int] = []
    for span in spans([block], tags):
        if not span.path and (span.kind == "head" or (span.kind == "join" and not joined)):
            continue
        ids.extend(span.ids)
    return ids


def flat(
    nodes: Sequence[Node], tags: TagIds, closed_threads: Collection[ThreadPath] = ()
) -> tuple[list[int], list[bool]]:
    """The trajectory's ids, and per id whether the model generated it (not injected)."""
    ids: list[int] = []
    generated: list[bool] = []
    for span in spans(nodes, tags, closed_threads):
        ids.extend(span.ids)
        generated.extend([span.generated] * len(span.ids))
    return ids, generated


def render(nodes: Sequence[Node], fmt: Format) -> list[int]:
    """The exact token ids of a tree: ``render(parse(ids).nodes, fmt) == ids``."""
    return flat(nodes, fmt.tags)[0]
