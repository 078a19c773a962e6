"""Fork-join trees: parse token ids into sequential text and parallel blocks, render back.

Grammar (over token ids; ``TEXT`` is any run of tokens that are not structural tags)::

    sequence := (TEXT | block)*
    block    := <Parallel> TEXT? <Outlines> (TEXT | <Outline> TEXT </Outline>)* </Outlines>
                thread{k} </Parallel>                       # k outlines numbered 1..k
    thread   := <Thread> seed(i) sequence </Thread>         # seed(i) = tokens of "i:"

Blocks nest inside threads up to ``max_depth``. ``<think>``/``</think>`` are ordinary
text here. Strict parsing (training data) raises :class:`TrajectoryFormatError` at the
first fault. Lenient parsing (model outputs) never raises: a malformed block, a block
nested deeper than ``max_depth`` and stray tags are kept as sequential text, and every
fault is listed in ``faults`` (a failed block once, as text up to its fault; a block past
``max_depth`` is found without descending into it). Only a ``max_depth`` of a few hundred, past
Python's recursion limit, lets a row nested that deep raise :class:`TrajectoryFormatError` (as
``injected`` does: the orchestrator's own output has no depth limit). Both are lossless:
:func:`threadweaver.layout.render` gives the ids back.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from threadweaver.format import Format, TagIds

DEFAULT_MAX_DEPTH = 3


@dataclass(frozen=True)
class Text:
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Outline:
    number: int
    ids: tuple[int, ...]
    """Tokens between ``<Outline>`` and ``</Outline>``."""


@dataclass(frozen=True)
class Thread:
    number: int
    seed: tuple[int, ...]
    """Tokens of ``"i:"`` that the orchestrator injects after ``<Thread>``."""
    body: tuple[Node, ...]
    """What the model generates after the seed, up to ``</Thread>`` (excluded)."""


@dataclass(frozen=True)
class Block:
    head: tuple[int, ...]
    """``<Parallel>`` through ``</Outlines>``, as generated."""
    outlines: tuple[Outline, ...]
    threads: tuple[Thread, ...]


Node = Text | Block


@dataclass(frozen=True)
class Fault:
    position: int
    tag: str | None
    message: str

    def __str__(self) -> str:
        where = f"token {self.position}" + (f" ({self.tag})" if self.tag else "")
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class Parsed:
    nodes: tuple[Node, ...]
    faults: tuple[Fault, ...] = ()

    @property
    def well_formed(self) -> bool:
        return not self.faults


class TrajectoryFormatError(ValueError):
    """A malformed trajectory; names the token position and the tag."""

    def __init__(self, fault: Fault):
        super().__init__(str(fault))
        self.fault = fault
        self.position = fault.position
        self.tag = fault.tag


class _Malformed(Exception):
    def __init__(self, fault: Fault):
        self.fault = fault


def parse(
    ids: Sequence[int],
    fmt: Format,
    *,
    strict: bool = True,
    max_depth: int = DEFAULT_MAX_DEPTH,
    injected: Collection[int] | None = None,
) -> Parsed:
    """Parse a trajectory (the assistant's tokens, no prompt) into a fork-join tree.

    ``injected``: the positions the orchestrator injected, for its own output (a
    ``generate`` row): then the tree is the one it decoded. A block is a block only where
    it forked it (its ``<Thread>`` and ``</Parallel>`` injected), at any depth, and a
    thread ends at the ``</Thread>`` that ended it (not one closing a ``<Thread>`` the model
    wrote in its text). Implies lenient parsing, which raises only for blocks nested deeper
    than Python's recursion limit allows (a few hundred).
    """
    if injected is not None:
        strict, max_depth = False, len(ids)
    parser = _Parser(list(ids), fmt, strict, max_depth, None if injected is None else frozenset(injected))
    try:
        nodes = parser.sequence(depth=0, thread=None)
    except RecursionError:  # a few hundred blocks deep: no model writes it, a hostile row may
        raise TrajectoryFormatError(parser.fault_at(parser.pos, "blocks nested too deep to read")) from None
    return Parsed(tuple(nodes), tuple(parser.faults))


def parse_text(text: str, fmt: Format, **kwargs) -> Parsed:
    """Parse trajectory text, tokenised as the orchestrator would (``Format.encode``)."""
    return parse(fmt.encode(text), fmt, **kwargs)


def parse_head(ids: Sequence[int], fmt: Format) -> tuple[Outline, ...]:
    """The outlines of a block head (``<Parallel>`` ... ``</Outlines>``, nothing after).

    Raises :class:`TrajectoryFormatError` naming the position of the first fault.
    """
    parser = _Parser(list(ids), fmt, True, DEFAULT_MAX_DEPTH)
    try:
        outlines = parser.head()
    except _Malformed as err:
        raise TrajectoryFormatError(err.fault) from None
    if parser.pos != len(ids):
        raise TrajectoryFormatError(parser.fault_at(parser.pos, "tokens after </Outlines> in a block head"))
    return tuple(outlines)


def closes_thread(text: Sequence[int], tags: TagIds) -> bool:
    """Whether a ``</Thread>`` after ``text`` (a thread's sequential tokens) ends the thread,
    rather than a ``<Thread>`` the model wrote in that text itself."""
    return text.count(tags.thread) <= text.count(tags.thread_end)


def tree_json(nodes: Sequence[Node], fmt: Format) -> list[dict]:
    """A readable JSON form of a tree: decoded text, outlines and threads, nested."""
    out = []
    for node in nodes:
        if isinstance(node, Text):
            out.append({"text": fmt.decode(node.ids)})
            continue
        out.append(
            {
                "outlines": [fmt.decode(o.ids) for o in node.outlines],
                "threads": [{"number": t.number, "body": tree_json(t.body, fmt)} for t in node.threads],
            }
        )
    return out


class _Parser:
    def __init__(
        self, ids: list[int], fmt: Format, strict: bool, max_depth: int, injected: frozenset[int] | None = None
    ):
        self.injected = injected
        self.ids = ids
        self.fmt = fmt
        self.tags = fmt.tags
        self.strict = strict
        self.max_depth = max_depth
        self.pos = 0
        self.faults: list[Fault] = []
        self.structural = fmt.tags.structural

    def fault_at(self, position: int, message: str) -> Fault:
        token = self.ids[position] if position < len(self.ids) else None
        tag = self.fmt.tag_name(token) if token is not None else "end of output"
        return Fault(position, tag, message)

    def fault(self, position: int, message: str) -> None:
        """A fault that leaves the structure intact: raise (strict) or record."""
        fault = self.fault_at(position, message)
        if self.strict:
            raise TrajectoryFormatError(fault)
        self.faults.append(fault)

    def sequence(self, depth: int, thread: int | None) -> list[Node]:
        """Parse until the end, or until ``</Thread>`` when inside ``thread``."""
        nodes: list[Node] = []
        text: list[int] = []
        ids, tags = self.ids, self.tags
        resumed = -1  # where a failed block's text ends: at its fault
        while self.pos < len(ids):
            token = ids[self.pos]
            if token == tags.parallel and not self.strict and depth + 1 > self.max_depth:
                # too deep to be a block: kept as text, found without descending into it (a hostile row
                # nested a thousand deep would pass Python's recursion limit)
                start, self.pos = self.pos, self._block_end(self.pos, inside_thread=thread is not None)
                self.faults.append(
                    self.fault_at(
                        start,
                        f"parallel block nested {depth + 1} deep; max_depth is {self.max_depth}: "
                        "kept as sequential text",
                    )
                )
                text.extend(ids[start : self.pos])
                continue
            if token == tags.parallel:
                start, recorded = self.pos, len(self.faults)
                try:
                    block = self.block(depth + 1)
                except _Malformed as err:
                    if self.strict:
                        raise TrajectoryFormatError(err.fault) from None
                    del self.faults[recorded:]
                    self.faults.append(err.fault)
                    self.pos = resumed = max(err.fault.position, start + 1)
                    text.extend(ids[start : self.pos])
                    continue
                if text:
                    nodes.append(Text(tuple(text)))
                    text = []
                nodes.append(block)
                continue
            if token == tags.thread_end and thread is not None:
                injected = self.injected
                if injected is None or self.pos in injected or closes_thread(text, tags):
                    break
            if token in self.structural and self.pos != resumed:  # a failed block's fault names it already
                self.fault(self.pos, "tag outside the place the format allows it (a parallel block)")
            elif thread is not None and token in self.fmt.eos_ids:
                self.fault(self.pos, f"end-of-sequence token inside thread {thread}")
            text.append(token)
            self.pos += 1
        if text:
            nodes.append(Text(tuple(text)))
        return nodes

    def _block_end(self, start: int, inside_thread: bool) -> int:
        """Past the ``</Parallel>`` that closes the ``<Parallel>`` at ``start`` (counting the blocks and threads
        between); else at the ``</Thread>`` that closes the thread it stands in (kept for that thread), or the
        end of the output."""
        tags, open_blocks, open_threads = self.tags, 0, 0
        for position in range(start, len(self.ids)):
            token = self.ids[position]
            if token == tags.thread_end and open_threads == 0 and inside_thread:
                return position
            open_blocks += (token == tags.parallel) - (token == tags.parallel_end)
            open_threads += (token == tags.thread) - (token == tags.thread_end)
            if open_blocks == 0:
                return position + 1
        return len(self.ids)

    def malformed(self, position: int, message: str) -> _Malformed:
        return _Malformed(self.fault_at(position, message))

    def expect(self, token: int, what: str) -> None:
        if self.pos >= len(self.ids) or self.ids[self.pos] != token:
            raise self.malformed(self.pos, f"expected {what}")
        self.pos += 1

    def block(self, depth: int) -> Block:
        start = self.pos
        if depth > self.max_depth:  # strict: a lenient parse keeps such a block as text before it gets here
            raise self.malformed(start, f"parallel block nested {depth} deep; max_depth is {self.max_depth}")
        outlines = self.head()
        head = tuple(self.ids[start : self.pos])
        threads = [self.thread(outline.number, depth) for outline in outlines]
        if self.pos < len(self.ids) and self.ids[self.pos] == self.tags.thread:
            raise self.malformed(self.pos, f"more threads than the {len(outlines)} outlines")
        end = self.pos
        self.expect(self.tags.parallel_end, f"</Parallel> after thread {len(outlines)}")
        self.require_injected(end, "</Parallel>")
        return Block(head, tuple(outlines), tuple(threads))

    def head(self) -> list[Outline]:
        """``<Parallel>`` through ``</Outlines>``: the outlines, numbered 1..k."""
        ids, tags = self.ids, self.tags
        self.pos += 1
        self.skip_text()
        self.expect(tags.outlines, "<Outlines> after <Parallel>")
        outlines: list[Outline] = []
        while True:
            self.skip_text()
            if self.pos >= len(ids):
                raise self.malformed(self.pos, "<Outlines> never closes")
            token = ids[self.pos]
            if token == tags.outlines_end:
                self.pos += 1
                break
            if token != tags.outline:
                raise self.malformed(self.pos, "only <Outline> entries may stand inside <Outlines>")
            outlines.append(self.outline(len(outlines) + 1))
        if not outlines:
            raise self.malformed(self.pos - 1, "a parallel block needs at least one outline")
        return outlines

    def require_injected(self, position: int, what: str) -> None:
        """In the orchestrator's output, a block's threads and join are injected where it forked it."""
        if self.injected is not None and position < len(self.ids) and position not in self.injected:
            raise self.malformed(position, f"the model wrote {what} itself: the block was not forked")

    def skip_text(self) -> None:
        while self.pos < len(self.ids) and self.ids[self.pos] not in self.structural:
            self.pos += 1

    def outline(self, expected: int) -> Outline:
        start = self.pos
        self.pos += 1
        self.skip_text()
        body = tuple(self.ids[start + 1 : self.pos])
        if self.pos >= len(self.ids) or self.ids[self.pos] != self.tags.outline_end:
            raise self.malformed(self.pos, f"outline {expected} is not closed by </Outline>")
        self.pos += 1
        number = self.fmt.outline_number(body)
        if number != expected:
            found = "no number" if number is None else f"number {number}"
            raise self.malformed(start, f"outline {expected} has {found}; outlines are numbered 1, 2, ... in order")
        return Outline(number, body)

    def thread(self, number: int, depth: int) -> Thread:
        ids = self.ids
        start = self.pos
        self.expect(self.tags.thread, f"<Thread> {number} (one thread per outline, in order)")
        self.require_injected(start, f"<Thread> {number}")
        seed = self.fmt.seed(number)
        if tuple(ids[self.pos : self.pos + len(seed)]) != seed:
            raise self.malformed(start, f"thread {number} does not start with its seed {number}:")
        self.pos += len(seed)
        body = self.sequence(depth, thread=number)
        if self.pos >= len(ids):
            raise self.malformed(self.pos, f"thread {number} never closes with </Thread>")
        if not body:
            self.fault(self.pos, f"thread {number} is empty")
        self.pos += 1
        return Thread(number, seed, tuple(body))
