"""The code stages of ``curate``: which proposed blocks hold, edits applied, the trajectory assembled.

Pure functions over a trace's units. A thread's text is its units joined with trailing whitespace
removed; the whitespace that ended a block's last unit follows ``</Parallel>``. Threads and outlines
are written ``<Thread>i:text</Thread>`` and ``<Outline>i:text</Outline>``, as the orchestrator seeds
them, with nothing between tags where it never generates anything.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace

from threadweaver.format import TAGS, THINK, THINK_END, block_text

from .schemas import Edit, ProposedBlock, Segmentation
from .traces import Trace


class Refused(ValueError):
    """A block (or reply) that a check refused: ``reason`` is its code, the message says why."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Block:
    """A block as unit ranges (0-based, ``stop`` exclusive), then its rewritten threads and outlines."""

    bounds: tuple[tuple[int, int], ...]
    threads: tuple[str, ...]
    outlines: tuple[str, ...] = ()

    @property
    def start(self) -> int:
        return self.bounds[0][0]

    @property
    def stop(self) -> int:
        return self.bounds[-1][1]


def extract(trace: Trace, proposed: ProposedBlock, max_threads: int, min_parallel_chars: int) -> Block:
    """The block ``proposed`` names, if it holds; else :class:`Refused`, its message the exact complaint
    (it is what a re-ask tells the LLM)."""
    n, spans = len(trace.units), proposed.threads
    if not 2 <= len(spans) <= max_threads:
        raise Refused("thread_count", f"{len(spans)} threads; a block needs 2 to {max_threads}")
    for k, span in enumerate(spans, 1):
        if not 1 <= span.first <= span.last <= n:
            why = f"the units are numbered 1-{n}" if span.first <= span.last else "its first unit comes after its last"
            raise Refused("out_of_range", f"thread {k} spans units {span.first}-{span.last}, but {why}")
        if k > 1 and span.first != spans[k - 2].last + 1:
            end = spans[k - 2].last
            gap = span.first > end + 1
            which = (
                f"no thread has {_units(end + 1, span.first - 1)}"
                if gap
                else "both have " + _units(span.first, min(end, span.last))
            )
            raise Refused(
                "thread_gap" if gap else "thread_overlap",
                f"thread {k} starts at unit {span.first}, but thread {k - 1} ends at unit {end}: {which}; "
                f"thread {k} must start at unit {end + 1}",
            )
    bounds = tuple((s.first - 1, s.last) for s in spans)
    threads = tuple("".join(trace.units[a:b]).rstrip() for a, b in bounds)
    outside_longest = sum(map(len, threads)) - max(map(len, threads))
    if outside_longest < min_parallel_chars:
        raise Refused(
            "too_little_parallel",
            f"{outside_longest} characters outside the longest thread; at least {min_parallel_chars} wanted "
            "(the threads must share the block's work more evenly)",
        )
    return Block(bounds, threads)


def _units(first: int, last: int) -> str:
    return f"unit {first}" if first == last else f"units {first}-{last}"


class NoBlockHolds(Refused):
    """No block of a segment reply holds: ``refused`` holds each block's index and :class:`Refused`."""

    def __init__(self, proposed: int, refused: list[tuple[int, Refused]]):
        complaints = "; ".join(f"block {index + 1}: {err}" for index, err in refused)
        super().__init__("no_block", f"no proposed block holds ({complaints})")
        self.proposed, self.refused = proposed, refused


def extract_all(
    trace: Trace, proposal: Segmentation, max_threads: int, min_parallel_chars: int
) -> tuple[list[tuple[int, Block]], list[tuple[int, Refused]]]:
    """(the blocks that hold, the refused ones), each with its index in ``proposal``; where blocks were
    proposed and none holds, :class:`NoBlockHolds` (a complaint ``LLM.ask`` re-asks with)."""
    held, refused = [], []
    for index, proposed in enumerate(proposal.blocks):
        try:
            held.append((index, extract(trace, proposed, max_threads, min_parallel_chars)))
        except Refused as err:
            refused.append((index, err))
    if refused and not held:
        raise NoBlockHolds(len(proposal.blocks), refused)
    return held, refused


def without_overlaps(blocks: list[Block]) -> tuple[list[Block], list[tuple[int, Block]]]:
    """(blocks in trace order that overlap no earlier-starting kept block, the others with their index)."""
    kept, dropped, end = [], [], 0
    for index, block in sorted(enumerate(blocks), key=lambda item: item[1].start):
        if block.start < end:
            dropped.append((index, block))
        else:
            kept.append(block)
            end = block.stop
    return kept, dropped


def apply_edits(block: Block, edits: list[Edit], max_edit_chars: int, max_change: float) -> Block:
    """The block with each edit applied where its ``find`` occurs exactly once; else :class:`Refused`."""
    threads = list(block.threads)
    for edit in edits:
        if not 1 <= edit.thread <= len(threads):
            raise Refused("edit_thread", f"an edit names thread {edit.thread} of {len(threads)}")
        if max(len(edit.find), len(edit.replace)) > max_edit_chars:
            raise Refused("edit_too_large", f"an edit of thread {edit.thread} is over {max_edit_chars} characters")
        text = threads[edit.thread - 1]
        count = text.count(edit.find)
        if count != 1:
            reason = "edit_absent" if count == 0 else "edit_ambiguous"
            raise Refused(reason, f"{edit.find!r} occurs {count} times in thread {edit.thread}, not once")
        threads[edit.thread - 1] = text.replace(edit.find, edit.replace)
    for k, (before, after) in enumerate(zip(block.threads, threads), 1):
        if not after.strip():
            raise Refused("too_changed", f"the edits leave thread {k} empty")
        changed = 1 - difflib.SequenceMatcher(None, before, after, autojunk=False).ratio()
        if changed > max_change:
            raise Refused("too_changed", f"the edits change {changed:.0%} of thread {k}; at most {max_change:.0%}")
    return replace(block, threads=tuple(threads))


def with_outlines(block: Block, outlines: list[str]) -> Block:
    if len(outlines) != len(block.threads):
        raise Refused("outline_count", f"{len(outlines)} outlines for {len(block.threads)} threads")
    # an outline that numbers itself ("1: add A") would read "1:1: add A" once the block numbers it
    outlines = [re.sub(rf"^\s*{k}\s*[:.)]\s*", "", text, count=1) for k, text in enumerate(outlines, 1)]
    for k, text in enumerate(outlines, 1):
        if not text.strip() or any(tag in text for tag in TAGS):
            raise Refused("outline_text", f"outline {k} is empty or holds a tag: {text!r}")
    return replace(block, outlines=tuple(o.strip() for o in outlines))


def assemble(trace: Trace, blocks: list[Block]) -> str:
    """The assistant's response with ``blocks`` (in trace order, not overlapping) in place."""
    pieces, at = [trace.lead], 0
    for block in blocks:
        pieces += trace.units[at : block.start]
        last = trace.units[block.stop - 1]
        pieces.append(block_text(block.outlines, block.threads))
        pieces.append(last[len(last.rstrip()) :])
        at = block.stop
    pieces += trace.units[at:]
    return f"{THINK}{''.join(pieces)}{THINK_END}{trace.final}"
