"""Token-latency statistics of a fork-join trajectory.

Definitions (all counts are of trajectory tokens; the prompt is not counted):

* ``total_tokens``: tokens the model generated. Injected tokens (each thread's
  ``<Thread>`` + ``"i:"`` seed, each ``</Parallel>``) are not generated: the
  orchestrator appends them and the engine only prefills them.
* ``critical_path_tokens`` (token latency): the generated tokens on the longest
  root-to-leaf chain through the fork-join tree. A block contributes its head
  (``<Parallel>`` through ``</Outlines>``) plus its longest thread, where a thread is
  its body (nested blocks by the same rule) plus its ``</Thread>``.
* ``speedup``: ``total_tokens / critical_path_tokens``; 1.0 for a sequential output.

The reference implementation's ``num_tokens_in_the_longest_thread`` counts every
token outside thread interiors as sequential, including all ``<Thread>``/``</Thread>``
tags and ``</Parallel>``, counts the ``"i:"`` prefix inside each thread, does not
credit nested blocks, and (because it re-tokenises prompt + response) adds the prompt.
``reference_longest_thread`` and ``reference_total_tokens`` give its rule on the
response alone for one-level trajectories (None where blocks nest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from threadweaver.tree import Node, Text


@dataclass(frozen=True)
class LatencyStats:
    total_tokens: int
    critical_path_tokens: int
    injected_tokens: int
    thread_tokens: int
    """Generated tokens inside threads (at any depth)."""
    blocks: int
    threads_per_block: tuple[int, ...]
    max_depth: int
    reference_longest_thread: int | None
    reference_total_tokens: int

    @property
    def speedup(self) -> float:
        return self.total_tokens / self.critical_path_tokens if self.critical_path_tokens else 1.0

    @property
    def parallel_ratio(self) -> float:
        """Share of generated tokens that were generated inside threads."""
        return self.thread_tokens / self.total_tokens if self.total_tokens else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "speedup": self.speedup, "parallel_ratio": self.parallel_ratio}


def latency_stats(nodes: Sequence[Node]) -> LatencyStats:
    walk = _Walk()
    total, critical = walk.sequence(nodes, depth=0)
    nested = walk.max_depth > 1
    return LatencyStats(
        total_tokens=total,
        critical_path_tokens=critical,
        injected_tokens=walk.injected,
        thread_tokens=walk.thread_tokens,
        blocks=len(walk.threads_per_block),
        threads_per_block=tuple(walk.threads_per_block),
        max_depth=walk.max_depth,
        reference_longest_thread=None if nested else reference_longest(nodes),
        reference_total_tokens=total + walk.injected,
    )


class _Walk:
    def __init__(self) -> None:
        self.injected = 0
        self.thread_tokens = 0
        self.threads_per_block: list[int] = []
        self.max_depth = 0

    def sequence(self, nodes: Sequence[Node], depth: int) -> tuple[int, int]:
        """(generated tokens, critical-path tokens) of a sequence."""
        total = critical = 0
        for node in nodes:
            if isinstance(node, Text):
                total += len(node.ids)
                critical += len(node.ids)
                continue
            self.max_depth = max(self.max_depth, depth + 1)
            self.threads_per_block.append(len(node.threads))
            self.injected += 1 + sum(1 + len(t.seed) for t in node.threads)
            longest = 0
            total += len(node.head)
            for thread in node.threads:
                t_total, t_critical = self.sequence(thread.body, depth + 1)
                total += t_total + 1
                if depth == 0:
                    self.thread_tokens += t_total + 1
                longest = max(longest, t_critical + 1)
            critical += len(node.head) + longest
        return total, critical


def reference_longest(nodes: Sequence[Node]) -> int:
    """The reference's longest-thread count on a one-level response (see module doc)."""
    count = 0
    for node in nodes:
        if isinstance(node, Text):
            count += len(node.ids)
            continue
        interiors = [len(t.seed) + sum(len(n.ids) for n in t.body) for t in node.threads]
        count += len(node.head) + 2 * len(node.threads) + 1 + max(interiors)
    return count
