"""Token-latency statistics of a fork-join trajectory.

Definitions (all counts are of trajectory tokens; the prompt is not counted):

* ``total_tokens``: tokens the model generated. Injected tokens (each thread's
  ``<Thread>`` + ``"i:"`` seed, each ``</Parallel>``) are not generated: the
  orchestrator appends them and the engine only prefills them.
* ``critical_path_tokens`` (token latency): the generated tokens on the longest
  root-to-leaf chain through the fork-join tree. A block contributes its head
  (``<Parallel>`` through ``</Outlines>``) plus its longest thread, where a thread is
  its body (nested blocks by the same rule) plus its ``</Thread>``.
* ``critical_sequences``: the sequences whose generated tokens make that chain, ``()`` for
  the main one, then thread paths in trajectory order (of equal threads, the first).
* ``speedup``: ``total_tokens / critical_path_tokens``; 1.0 for a sequential output.

A ``</Thread>`` the orchestrator injected to close a thread (``closed_threads``) is not
generated; threads run one after another (``concurrent_threads=False``) put every
thread on the critical path.

``reference_longest_thread`` is the reference implementation's
``num_tokens_in_the_longest_thread``, by its own rule: one flat scan of the tags in the
token ids, for any output, malformed ones included. Outside a block every token counts.
A ``<Parallel>`` opens a block (it counts) and a ``</Parallel>`` outside a thread closes
it (it counts); inside, a ``<Thread>`` opens a thread that only a ``</Thread>`` ends, and
the block adds its tokens outside threads (the ``<Thread>``/``</Thread>`` tags included)
plus its longest thread (its ``"i:"`` included). Tags inside a thread are thread text, so
nested blocks get no credit; a block still open at the end counts as if closed there.
The reference re-tokenises prompt + response and so adds the prompt; this is the response
alone. ``reference_total_tokens`` is every token of the response. Both need the tags'
ids: without them ``reference_longest_thread`` is None.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, fields

from threadweaver.format import TagIds
from threadweaver.layout import ThreadPath, flat, spans
from threadweaver.tree import Node

_UNNAMED_TAGS = TagIds(*[-1] * 10)
"""Counting needs the layout's lengths, not the tags' ids."""


def speedup(before: float, after: float) -> float:
    """How many times ``after`` is shorter than ``before`` (generated tokens over critical-path
    tokens, a baseline's wall-clock over a run's); 1.0 where ``after`` is 0."""
    return before / after if after else 1.0


@dataclass(frozen=True)
class LatencyStats:
    total_tokens: int
    critical_path_tokens: int
    injected_tokens: int
    thread_tokens: int
    """Generated tokens inside threads (at any depth)."""
    blocks: int
    threads_per_block: tuple[int, ...]
    """In the order the blocks open in the trajectory."""
    max_depth: int
    reference_longest_thread: int | None
    reference_total_tokens: int
    critical_sequences: tuple[ThreadPath, ...] = ((),)
    """The sequences on the critical path: ``()`` (the main one), then thread paths in trajectory order."""

    @property
    def speedup(self) -> float:
        return speedup(self.total_tokens, self.critical_path_tokens)

    @property
    def parallel_ratio(self) -> float:
        """Share of generated tokens that were generated inside threads."""
        return self.thread_tokens / self.total_tokens if self.total_tokens else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "speedup": self.speedup, "parallel_ratio": self.parallel_ratio}

    @classmethod
    def from_dict(cls, data: dict) -> LatencyStats:
        """What :meth:`as_dict` wrote (a JSONL row's ``stats``)."""
        values = {f.name: data[f.name] for f in fields(cls)}
        values["threads_per_block"] = tuple(values["threads_per_block"])
        values["critical_sequences"] = tuple(
            tuple(tuple(step) for step in path) for path in values["critical_sequences"]
        )
        return cls(**values)


def latency_stats(
    nodes: Sequence[Node],
    tags: TagIds | None = None,
    *,
    closed_threads: Collection[ThreadPath] = (),
    concurrent_threads: bool = True,
) -> LatencyStats:
    """The statistics of a tree; ``tags`` (the format's tag ids) adds ``reference_longest_thread``."""
    total = injected = thread_tokens = max_depth = 0
    threads_per_block: list[int] = []
    critical = [_Chain(0, [()])]
    """The critical path of each open sequence, innermost last."""
    blocks: list[tuple[int, _Chain]] = []
    """Per open block: its index in ``threads_per_block``, and its threads' critical path."""
    for span in spans(nodes, _UNNAMED_TAGS, closed_threads):
        n = len(span.ids)
        if span.generated:
            total += n
            critical[-1].tokens += n
            thread_tokens += n if span.path else 0
        else:
            injected += n
        if span.kind == "head":
            max_depth = max(max_depth, len(span.path) + 1)
            blocks.append((len(threads_per_block), _Chain(0, [])))
            threads_per_block.append(0)
        elif span.kind == "open":
            threads_per_block[blocks[-1][0]] += 1
            critical.append(_Chain(0, [span.path]))
        elif span.kind == "close":
            blocks[-1][1].take(critical.pop(), longest=concurrent_threads)
        elif span.kind == "join":
            critical[-1].extend(blocks.pop()[1])
    return LatencyStats(
        total_tokens=total,
        critical_path_tokens=critical[0].tokens,
        injected_tokens=injected,
        thread_tokens=thread_tokens,
        blocks=len(threads_per_block),
        threads_per_block=tuple(threads_per_block),
        max_depth=max_depth,
        reference_longest_thread=None if tags is None else reference_longest(flat(nodes, tags)[0], tags),
        reference_total_tokens=total + injected,
        critical_sequences=tuple(critical[0].sequences),
    )


@dataclass
class _Chain:
    """A critical path under construction: its generated tokens and the sequences they come from."""

    tokens: int
    sequences: list[ThreadPath]

    def take(self, thread: _Chain, longest: bool) -> None:
        """A block's path with one more thread: the longest (the first of equals), or all of them."""
        if not longest:
            self.extend(thread)
        elif not self.sequences or thread.tokens > self.tokens:
            self.tokens, self.sequences = thread.tokens, thread.sequences

    def extend(self, after: _Chain) -> None:
        self.tokens += after.tokens
        self.sequences.extend(after.sequences)


def reference_longest(ids: Sequence[int], tags: TagIds) -> int:
    """The reference's longest-thread count of a response's token ids (see the module doc)."""
    outside = blocks = 0
    block: int | None = None
    """Tokens of the open block outside its threads (None: no block is open)."""
    thread: int | None = None
    """Tokens of the open thread (None: none is open)."""
    threads: list[int] = []
    for token in ids:
        if block is None:
            outside += 1
            if token == tags.parallel:
                block, threads = 0, []
        elif thread is not None:
            if token == tags.thread_end:
                threads.append(thread)
                thread, block = None, block + 1
            else:
                thread += 1
        elif token == tags.parallel_end:
            blocks += block + max(threads, default=0)
            outside, block = outside + 1, None
        else:
            thread = 0 if token == tags.thread else None
            block += 1
    if block is not None:
        blocks += block + max([*threads, *([thread] if thread is not None else [])], default=0)
    return outside + blocks
