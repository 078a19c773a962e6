"""What ``curate`` asks the LLM at each stage (our own wording), as chat messages.

A stage's messages, its reply schema and its ``VERSION`` make up its calls' cache keys: editing a
prompt here reruns that stage's calls, and later stages only where their input changed. Bump a
stage's version when the code that reads its replies changes meaning.
"""

from __future__ import annotations

from collections.abc import Sequence

VERSION = {"segment": 1, "decouple": 1, "outline": 1}

SEGMENT = """\
You help rewrite a step-by-step solution so that parts of it can be worked out in parallel.
The solution comes as numbered units, one line each. Find parallel blocks. A block is a run of \
consecutive units split into 2 to {max_threads} threads; each thread is a run of consecutive \
units, and the threads follow one another with no gap and no overlap. Every thread of a block \
must be workable from the problem and the units before the block alone, without any result of \
another thread of the same block. Units after a block may use all of its results, so leave the \
units that combine the threads' results, and the final answer, outside the blocks. Blocks do \
not overlap. Prefer blocks whose threads do similar amounts of work. If nothing can be worked \
out in parallel, return no blocks. Give units by their numbers."""

DECOUPLE = """\
The threads below will be written at the same time, each without seeing the others: a thread \
sees the problem and the text before the block, never a sibling thread. Where a thread relies \
on another thread's work or result (a value it found, "as above", "the other case"), propose \
find/replace edits that make the thread stand on its own, changing as little as possible. \
`find` must be copied exactly from the thread it edits and occur in it only once. If the \
threads already stand on their own, return no edits."""

OUTLINE = """\
Write one outline per thread below, in the same order: one short sentence that says what the \
thread will work out, as a plan written before it starts (never its result). No numbering."""

REASK = "That reply was refused: {detail}. Answer again, following the schema and fixing this."


def _problem(problem: str) -> str:
    return f"Problem:\n{problem.strip()}"


def segment(problem: str, units: Sequence[str], max_threads: int) -> list[dict]:
    numbered = "\n".join(f"[{i}] {unit.strip()}" for i, unit in enumerate(units, 1))
    return [
        {"role": "system", "content": SEGMENT.format(max_threads=max_threads)},
        {"role": "user", "content": f"{_problem(problem)}\n\nSolution units:\n{numbered}"},
    ]


def _threads(threads: Sequence[str]) -> str:
    return "\n\n".join(f"Thread {i}:\n{text}" for i, text in enumerate(threads, 1))


def decouple(problem: str, before: str, threads: Sequence[str]) -> list[dict]:
    context = before.strip() or "(nothing: the block opens the solution)"
    return [
        {"role": "system", "content": DECOUPLE},
        {"role": "user", "content": f"{_problem(problem)}\n\nText before the block:\n{context}\n\n{_threads(threads)}"},
    ]


def outline(problem: str, threads: Sequence[str]) -> list[dict]:
    return [
        {"role": "system", "content": OUTLINE},
        {"role": "user", "content": f"{_problem(problem)}\n\n{_threads(threads)}"},
    ]


def reask(messages: list[dict], reply: str, detail: str) -> list[dict]:
    """The conversation again, with the refused reply and why it was refused."""
    return [
        *messages,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": REASK.format(detail=detail)},
    ]
