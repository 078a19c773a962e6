"""Peers' parallel datasets in our format (``threadweaver convert IN OUT --from SOURCE``).

Each source's rows become our chat rows ``{"id", "messages": [..., {"role": "assistant",
"content": "<think>\\n...</think>\\n..."}], "answer"?}`` that ``threadweaver sft`` reads, or a
typed :data:`Reason` naming what could not convert. Every converted row passes our strict parser
(:func:`threadweaver.tree.parse_text`, ``strict=True``) with the target tokenizer.

The shapes, as read (for facts only) from each peer's published code, with where:

* ``multiverse`` (Multiverse-1K; Multiverse4FM/Multiverse, read in its fork ogso-eu/Multiverse:
  ``data/src/data/parse.py``, ``distance.py``, ``tokenization_multiverse.py``, ``data/prompt/
  step3-prompt.txt``). A row is an s1K-1.1 row plus ``deepseek_thinking_trajectory_parallel``:
  ``<Think>...</Think>``, in which ``<Parallel>`` holds one ``<Goal>`` of ``<Outline>``s, then
  ``<Path>``s, then one ``<Conclusion>``, the last child, inside ``</Parallel>``. Every tag
  stands on a line of its own. Outlines and paths start ``n: ``, and a nested block (inside a
  ``<Path>``) numbers them with the parent's id: ``1.1: ``, ``1.2: ``. The problem is
  ``question`` and the final answer text ``deepseek_attempt``. Mapping: Goal -> Outlines,
  Path -> Thread, the dotted number -> its last part (the bare local number is accepted too),
  the Conclusion -> sequential text right after ``</Parallel>``; the assistant content is
  ``<think>\\n{converted}\\n</think>\\n{deepseek_attempt}``.
* ``reference`` (facebookresearch/threadweaver, ``data_generation/src/save_dataset.py``,
  ``filter-format-correct-and-obtain-stats.py``). A parquet whose ``qwen_text`` column is the
  whole chat rendered by the Qwen3 template: ``<|im_start|>user\\n{problem} {instruction}
  <|im_end|>\\n<|im_start|>assistant\\n<think>\\n...\\n</think>\\n\\n{answer}<|im_end|>\\n``; the
  problem is also a ``question`` column, but the prompt we keep is the rendered turns before the
  assistant's (instruction included), as the reference trained on it. Threads are normalised to
  ``<Thread>\\nk: ...\\n</Thread>`` with nothing between adjacent threads; outlines are
  ``<Outline>k: ...</Outline>`` inside ``<Outlines>``, with whitespace between them; a block
  may end with one ``<Conclusion>`` after its threads, inside ``</Parallel>``. Mapping: the
  thread and outline text loses the whitespace around ``k:`` and at its end, so
  ``<Thread>\\nk: text\\n</Thread>`` becomes ``<Thread>k:text</Thread>``; whitespace between
  tags of a block is dropped; the Conclusion becomes sequential text after ``</Parallel>``.
* ``npr`` (bigai-nlco/Native-Parallel-Reasoner: ``npr-beta/prompts/npr.txt``,
  ``npr-beta/sampling/rejection_sampling.py``, ``npr-beta/train/utils.py``, ``evals/utils/
  grader.py``). No wrapper tag: a block is ``<guideline>`` holding ``<plan>k: ...</plan>``s
  (numbered like our outlines), then, after ``</guideline>``, one ``<step>\\nk: ...\\n</step>``
  per plan, then one ``<takeaway>`` that closes the block; the final answer follows the last
  takeaway, outside any tag. The rejection sampler's rows are a JSON array of ``{"id",
  "problem", "prompt", "reference", "trajectory": [str, ...], ...}`` (``reference`` is the
  ground-truth answer; one trajectory per accepted sample); its SFT set has a rendered chat in
  ``text``. Mapping: guideline -> Outlines, plan -> Outline, step -> Thread, takeaway ->
  sequential text after ``</Parallel>``. Its model is a non-thinking Qwen3, so a trajectory
  without ``</think>`` is wrapped: ``<think>\\n{through the last takeaway}\\n</think>\\n{the
  rest}``. Each trajectory of a list is a row of its own, with ``sample`` its index.

Not verified, so taken as FIELD.md reads them: nesting in NPR (its SFT mask builder refuses a
``<guideline>`` inside a block, FIELD.md and its engine's stack allow it): a ``<guideline>``
inside a ``<step>`` converts to a nested block. No dataset card of Multiverse-1K or of the
reference's parquet was found, so their columns are those their own scripts write and read
(the Multiverse4FM repository itself could not be fetched; its fork was read).

Whitespace: a converted outline is ``<Outline>k:{text}</Outline>`` and a thread
``<Thread>k:{body}</Thread>``, text and body stripped at both ends (the orchestrator seeds
``<Thread>`` + ``"k:"`` and nothing else); nothing stands between the tags of a block where
the orchestrator never generates anything. Text between ``<Parallel>`` and the outlines is kept
(stripped) when it is not blank. A conclusion or takeaway, stripped, follows ``</Parallel>``
after a newline, and a newline separates it from the text after it if that text does not start
with whitespace. Everything else is kept as it is.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from statistics import mean
from typing import Literal, get_args

from threadweaver.cli_args import option
from threadweaver.format import (
    OUTLINE,
    OUTLINE_END,
    OUTLINES,
    OUTLINES_END,
    PARALLEL,
    PARALLEL_END,
    THREAD,
    THREAD_END,
    Format,
)
from threadweaver.jsonl import RowError, read_rows, write_json, write_jsonl
from threadweaver.stats import latency_stats
from threadweaver.tree import DEFAULT_MAX_DEPTH, TrajectoryFormatError, parse_text

Source = Literal["multiverse", "reference", "npr"]
SOURCES: tuple[Source, ...] = get_args(Source)

Reason = Literal[
    "unreadable",  # the line is not a JSON object (JSONL) or the row not an object
    "no_text",  # no trajectory text in the row
    "no_problem",  # no problem text in the row
    "no_assistant",  # a rendered chat with no assistant turn
    "unknown_tag",  # a tag of another format (or ours) in the source's text
    "unbalanced",  # a tag that closes nothing open, or one never closed
    "misplaced",  # a tag or text where the source's format allows none
    "numbering",  # an outline or thread without its number 1, 2, ... (or 1.1, ... nested)
    "missing_outline",  # more threads than outlines
    "missing_thread",  # more outlines than threads, or a block with none
    "missing_conclusion",  # a Multiverse block without <Conclusion>, an NPR one without <takeaway>
    "too_deep",  # blocks nested deeper than max_depth
    "malformed",  # our strict parser refused the converted text (detail: its token position)
    "sequential",  # no parallel block, with keep_sequential off
]
REASONS: tuple[Reason, ...] = get_args(Reason)

FIELDS: dict[Source, str] = {
    "multiverse": "deepseek_thinking_trajectory_parallel",
    "reference": "qwen_text",
    "npr": "trajectory",
}
"""The field holding each source's text, as published."""

NPR_INSTRUCTION = "\n\nYou must write your answer strictly"
"""Where NPR's format instruction starts in its rendered prompts (cut from the problem)."""


@dataclass(frozen=True)
class ConvertConfig:
    max_depth: int = option(DEFAULT_MAX_DEPTH, "Deepest nesting of blocks kept; a row nested deeper is dropped.")
    keep_sequential: bool = option(True, "Keep rows with no parallel block, as sequential rows (default: keep).")
    text_field: str | None = option(
        None,
        "Read the source's text from this field (default: its published one: "
        + ", ".join(f"{s} {f}" for s, f in FIELDS.items())
        + ")",
    )

    def __post_init__(self):
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be at least 1, not {self.max_depth}")


@dataclass(frozen=True)
class Failure:
    """Why a row does not convert."""

    reason: Reason
    detail: str


class Refused(Exception):
    def __init__(self, reason: Reason, detail: str):
        super().__init__(detail)
        self.failure = Failure(reason, detail)


# ---- the tags of a source's text ----

_NAMES = (
    "Outlines Outline Parallel Thread Conclusion Goal Path Summary Think think guideline plan step takeaway".split()
)
"""Every tag name of the formats in the field (ours, the reference's, Multiverse's, NPR's,
Parallel-R1's ``Summary``): one of these that a source does not write is an unknown tag."""
_TAG = re.compile(r"<(/?)(" + "|".join(_NAMES) + r")>")
_NUMBER = re.compile(r"\s*(\d+(?:\.\d+)*)\s*:")


@dataclass(frozen=True)
class _Syntax:
    name: Source
    opener: str
    """The tag that opens a block: a wrapper, or the outlines' container where there is none."""
    outlines: str
    outline: str
    thread: str
    join: str
    join_required: bool
    dotted: bool
    """Nested outlines and threads may carry their parent's number (``1.2:``)."""
    text_tags: frozenset[str] = frozenset()
    """Tags kept as plain text (``<think>``)."""
    extra: frozenset[str] = frozenset()
    """Other tags of the source, never allowed inside a trajectory."""

    @property
    def wrapped(self) -> bool:
        return self.opener != self.outlines

    @property
    def names(self) -> frozenset[str]:
        return frozenset({self.opener, self.outlines, self.outline, self.thread, self.join}) | self.extra


MULTIVERSE = _Syntax(
    "multiverse", "Parallel", "Goal", "Outline", "Path", "Conclusion", True, True, extra=frozenset({"Think"})
)
REFERENCE = _Syntax(
    "reference", "Parallel", "Outlines", "Outline", "Thread", "Conclusion", False, False, text_tags=frozenset({"think"})
)
NPR = _Syntax("npr", "guideline", "guideline", "plan", "step", "takeaway", True, False, text_tags=frozenset({"think"}))


@dataclass(frozen=True)
class _Tag:
    pos: int
    name: str
    closing: bool

    def __str__(self) -> str:
        return f"<{'/' if self.closing else ''}{self.name}> at character {self.pos}"


@dataclass(frozen=True)
class _Text:
    pos: int
    text: str


def _split(text: str) -> list[_Tag | _Text]:
    parts: list[_Tag | _Text] = []
    at = 0
    for m in _TAG.finditer(text):
        if m.start() > at:
            parts.append(_Text(at, text[at : m.start()]))
        parts.append(_Tag(m.start(), m.group(2), bool(m.group(1))))
        at = m.end()
    if at < len(text):
        parts.append(_Text(at, text[at:]))
    return parts


class _Converter:
    """One source text to ours; raises :class:`Refused` at the first fault."""

    def __init__(self, text: str, syntax: _Syntax, max_depth: int):
        self.syntax = syntax
        self.max_depth = max_depth
        self.parts = _split(text)
        self.i = 0
        tags = [p for p in self.parts if isinstance(p, _Tag) and p.name not in syntax.text_tags]
        for tag in tags:
            if tag.name not in syntax.names:
                raise Refused("unknown_tag", f"{tag} is not a tag of the {syntax.name} format")
        open_: list[_Tag] = []
        for tag in tags:  # the source's tags all come in pairs, properly nested
            if not tag.closing:
                open_.append(tag)
            elif not open_ or open_[-1].name != tag.name:
                raise Refused("unbalanced", f"{tag} " + (f"while {open_[-1]} is open" if open_ else "closes nothing"))
            else:
                open_.pop()
        if open_:
            raise Refused("unbalanced", f"{open_[-1]} is never closed")

    def convert(self) -> str:
        """Our text; ``self.cut``: where the last top-level block and its conclusion end in it."""
        self.cut = 0
        return self.sequence(0, "", None)[0]

    def peek(self) -> _Tag | _Text | None:
        return self.parts[self.i] if self.i < len(self.parts) else None

    def at(self, name: str, closing: bool = False) -> bool:
        part = self.peek()
        return isinstance(part, _Tag) and part.name == name and part.closing == closing

    def unexpected(self, want: str) -> Refused:
        part = self.peek()
        if part is None:
            return Refused("unbalanced", f"the text ends where {want} was expected")
        if isinstance(part, _Text):
            return Refused(
                "misplaced", f"text {part.text.strip()[:40]!r} at character {part.pos} where {want} was expected"
            )
        return Refused("unbalanced" if part.closing else "misplaced", f"{part} where {want} was expected")

    def expect(self, name: str, closing: bool, want: str) -> None:
        if not self.at(name, closing):
            raise self.unexpected(want)
        self.i += 1

    def text(self) -> str:
        out = []
        while isinstance(part := self.peek(), _Text):
            out.append(part.text)
            self.i += 1
        return "".join(out)

    def gap(self, want: str) -> None:
        """Whitespace between tags (dropped); other text is misplaced."""
        while isinstance(part := self.peek(), _Text):
            if part.text.strip():
                raise self.unexpected(want)
            self.i += 1

    def ended(self) -> bool:
        """An unwrapped block ends at text that no step or takeaway follows (its takeaway is missing)."""
        k, blank = self.i, True
        while k < len(self.parts) and isinstance(part := self.parts[k], _Text):
            blank, k = blank and not part.text.strip(), k + 1
        tag = self.parts[k] if k < len(self.parts) else None
        return not blank and not (tag and not tag.closing and tag.name in (self.syntax.thread, self.syntax.join))

    def sequence(self, depth: int, path: str, thread: _Tag | None) -> tuple[str, bool]:
        """Text and blocks up to the end, or to the ``</...>`` that closes ``thread``."""
        syntax, out, joined = self.syntax, [], False
        while (part := self.peek()) is not None:
            if isinstance(part, _Text):
                piece, ends_joined = part.text, False
                self.i += 1
            elif thread is not None and part.closing and part.name == thread.name:
                break
            elif part.name in syntax.text_tags:
                piece, ends_joined = f"<{'/' if part.closing else ''}{part.name}>", False
                self.i += 1
            elif part.name == syntax.opener and not part.closing:
                piece, ends_joined = self.block(depth + 1, path)
            elif part.closing:
                opened = f"<{thread.name}> at character {thread.pos} is closed" if thread else "anything is open"
                raise Refused("unbalanced", f"{part} before {opened}")
            else:
                raise Refused("misplaced", f"{part} outside the place the {syntax.name} format allows it")
            if joined and piece and not piece[0].isspace():
                out.append("\n")
            out.append(piece)
            if depth == 0 and isinstance(part, _Tag) and part.name == syntax.opener:
                self.cut = sum(map(len, out))
            joined = ends_joined
        else:
            if thread is not None:
                raise Refused("unbalanced", f"{thread} is never closed")
        return "".join(out), joined

    def number(self, kind: str, found: str | None, k: int, path: str, block: _Tag) -> str:
        """Check the number of outline or thread ``k``; its full (dotted) id."""
        full = f"{path}.{k}" if path and self.syntax.dotted else str(k)
        if found not in {str(k), full}:
            has = "no number" if found is None else f"number {found!r}"
            raise Refused("numbering", f"{kind} {k} of the block at character {block.pos} has {has}, not {full!r}")
        return full

    def block(self, depth: int, path: str) -> tuple[str, bool]:
        s, start = self.syntax, self.peek()
        assert isinstance(start, _Tag)
        if depth > self.max_depth:
            raise Refused(
                "too_deep", f"the block at character {start.pos} is nested {depth} deep; max_depth is {self.max_depth}"
            )
        pre = ""
        if s.wrapped:
            self.i += 1
            pre = self.text().strip()
        self.expect(s.outlines, False, f"<{s.outlines}> (the block at character {start.pos})")
        outlines = []
        while True:
            self.gap(f"<{s.outline}> or </{s.outlines}>")
            if self.at(s.outlines, closing=True):
                self.i += 1
                break
            self.expect(s.outline, False, f"<{s.outline}> or </{s.outlines}>")
            body = self.text()
            self.expect(s.outline, True, f"</{s.outline}>")
            match = _NUMBER.match(body)
            k = len(outlines) + 1
            self.number("outline", match and match.group(1), k, path, start)
            outlines.append(body[match.end() :].strip())
        threads = []
        while True:
            if not s.wrapped and self.ended():
                break
            self.gap(f"<{s.thread}>, <{s.join}> or </{s.opener}>")
            if not self.at(s.thread):
                break
            opened = self.peek()
            self.i += 1
            first = self.peek()
            match = _NUMBER.match(first.text) if isinstance(first, _Text) else None
            child = self.number("thread", match and match.group(1), len(threads) + 1, path, start)
            body, _ = self.sequence(depth, child, opened)
            self.i += 1  # the closing tag
            threads.append(body[_NUMBER.match(body).end() :].strip())
        join = ""
        if self.at(s.join):
            self.i += 1
            join = self.text().strip()
            self.expect(s.join, True, f"</{s.join}>")
        elif s.join_required:
            raise Refused(
                "missing_conclusion", f"the block at character {start.pos} has no <{s.join}> after its threads"
            )
        if s.wrapped:
            self.gap(f"</{s.opener}>")
            self.expect(s.opener, True, f"</{s.opener}> (the block at character {start.pos})")
        if not threads or len(threads) < len(outlines):
            raise Refused(
                "missing_thread",
                f"the block at character {start.pos} has {len(outlines)} outlines, {len(threads)} threads",
            )
        if len(threads) > len(outlines):
            raise Refused(
                "missing_outline",
                f"the block at character {start.pos} has {len(threads)} threads, {len(outlines)} outlines",
            )
        text = (
            PARALLEL
            + pre
            + OUTLINES
            + "".join(f"{OUTLINE}{k}:{o}{OUTLINE_END}" for k, o in enumerate(outlines, 1))
            + OUTLINES_END
            + "".join(f"{THREAD}{k}:{t}{THREAD_END}" for k, t in enumerate(threads, 1))
            + PARALLEL_END
        )
        return (text + "\n" + join, True) if join else (text, False)


def convert_text(text: str, source: Source, max_depth: int = DEFAULT_MAX_DEPTH) -> str:
    """A source's trajectory text in our format; :class:`Refused` says why not."""
    return _Converter(text, _SYNTAX[source], max_depth).convert()


_SYNTAX: dict[Source, _Syntax] = {"multiverse": MULTIVERSE, "reference": REFERENCE, "npr": NPR}


# ---- rows ----


def _string(row: dict, name: str, reason: Reason) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        found = "missing" if value is None else "empty" if isinstance(value, str) else f"a {type(value).__name__}"
        raise Refused(reason, f"field {name!r} is {found}, not text")
    return value


def _answer(row: dict, *names: str) -> dict:
    for name in names:
        value = row.get(name)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value).strip():
            return {"answer": str(value)}
    return {}


def _row_id(row: dict) -> dict:
    value = row.get("id") if row.get("id") is not None else row.get("uuid")
    return {"id": str(value)} if isinstance(value, (str, int)) and str(value) else {}


def _chat(text: str) -> tuple[list[dict], str]:
    """A rendered ChatML conversation: (the turns before the last assistant turn, its content)."""
    turns = [
        {"role": m.group(1), "content": m.group(2)}
        for m in re.finditer(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|\Z)", text, re.S)
    ]
    last = max((k for k, t in enumerate(turns) if t["role"] == "assistant"), default=None)
    if last is None:
        raise Refused("no_assistant", f"no assistant turn in the {len(turns)} rendered chat turns")
    if not any(t["role"] == "user" for t in turns[:last]):
        raise Refused("no_problem", "no user turn before the assistant's in the rendered chat")
    return turns[:last], turns[last]["content"]


def _think(reasoning: str, answer: str) -> str:
    return f"<think>\n{reasoning.strip()}\n</think>\n{answer.strip()}"


def convert_multiverse(row: dict, config: ConvertConfig = ConvertConfig()) -> dict | Failure:
    """A Multiverse-1K row as our chat row, or why not."""
    try:
        text = _string(row, config.text_field or FIELDS["multiverse"], "no_text").strip()
        problem = _string(row, "question", "no_problem")
        if text.startswith("<Think>") and text.endswith("</Think>"):
            text = text[len("<Think>") : -len("</Think>")]
        reasoning = convert_text(text, "multiverse", config.max_depth)
    except Refused as err:
        return err.failure
    final = row.get("deepseek_attempt")
    content = _think(reasoning, final if isinstance(final, str) else "")
    return {
        **_row_id(row),
        "messages": [{"role": "user", "content": problem}, _assistant(content)],
        **_answer(row, "answer"),
    }


def convert_reference(row: dict, config: ConvertConfig = ConvertConfig()) -> dict | Failure:
    """A row of the reference's SFT parquet (its rendered ``qwen_text``) as our chat row, or why not."""
    try:
        prompt, content = _chat(_string(row, config.text_field or FIELDS["reference"], "no_text"))
        content = convert_text(content, "reference", config.max_depth)
    except Refused as err:
        return err.failure
    return {**_row_id(row), "messages": [*prompt, _assistant(content)], **_answer(row, "answer")}


def convert_npr(row: dict, config: ConvertConfig = ConvertConfig()) -> dict | Failure:
    """An NPR row with one trajectory (see :func:`samples`) as our chat row, or why not."""
    name = config.text_field or FIELDS["npr"]
    try:
        if name not in row and "text" in row:
            prompt, trajectory = _chat(_string(row, "text", "no_text"))
            prompt = [{**t, "content": t["content"].split(NPR_INSTRUCTION)[0]} for t in prompt]
        else:
            trajectory = _string(row, name, "no_text")
            prompt = [{"role": "user", "content": _string(row, "problem", "no_problem")}]
        converter = _Converter(trajectory, NPR, config.max_depth)
        content = converter.convert()
        if "</think>" not in trajectory:  # through the last takeaway in <think>, the final answer after
            content = _think(content[: converter.cut], content[converter.cut :])
    except Refused as err:
        return err.failure
    return {**_row_id(row), "messages": [*prompt, _assistant(content)], **_answer(row, "answer", "reference")}


def _assistant(content: str) -> dict:
    return {"role": "assistant", "content": content}


CONVERTERS: dict[Source, Callable[[dict, ConvertConfig], dict | Failure]] = {
    "multiverse": convert_multiverse,
    "reference": convert_reference,
    "npr": convert_npr,
}


def samples(row: dict, source: Source, config: ConvertConfig = ConvertConfig()) -> list[tuple[int | None, dict]]:
    """(sample index, row) per trajectory: NPR's list of trajectories is a row each."""
    name = config.text_field or FIELDS[source]
    if source == "npr" and isinstance(row.get(name), list) and row[name]:
        return [(k, {**row, name: t}) for k, t in enumerate(row[name])]
    return [(None, row)]


# ---- files ----


@dataclass(frozen=True)
class Outcome:
    """One converted or dropped trajectory (``row`` None: dropped for ``reason``)."""

    line: int
    """The JSONL line, or the 1-based row of a parquet or JSON file."""
    id: str | None
    sample: int | None
    row: dict | None = None
    reason: Reason | None = None
    detail: str = ""
    blocks: int = 0
    threads: int = 0
    depth: int = 0
    speedup: float = 1.0


def convert_row(
    row: dict, line: int, source: Source, fmt: Format, config: ConvertConfig = ConvertConfig()
) -> list[Outcome]:
    """Every trajectory of one input row, converted and checked by our strict parser, or dropped."""
    outcomes = []
    for sample, one in samples(row, source, config):
        rid = _row_id(one).get("id")
        converted = CONVERTERS[source](one, config)
        if isinstance(converted, Failure):
            outcomes.append(Outcome(line, rid, sample, reason=converted.reason, detail=converted.detail))
            continue
        converted.setdefault("id", f"{source}-{line}")
        if sample is not None:
            converted["sample"] = sample
        outcomes.append(_checked(converted, line, rid, sample, fmt, config))
    return outcomes


def _checked(row: dict, line: int, rid: str | None, sample: int | None, fmt: Format, config: ConvertConfig) -> Outcome:
    content = row["messages"][-1]["content"]
    try:
        parsed = parse_text(content, fmt, strict=True, max_depth=config.max_depth)
    except (TrajectoryFormatError, ValueError) as err:
        return Outcome(line, rid, sample, reason="malformed", detail=f"strict parse of the converted text: {err}")
    stats = latency_stats(parsed.nodes)
    if not stats.blocks and not config.keep_sequential:
        return Outcome(line, rid, sample, reason="sequential", detail="no parallel block")
    return Outcome(
        line,
        row["id"],
        sample,
        row,
        None,
        "",
        stats.blocks,
        sum(stats.threads_per_block),
        stats.max_depth,
        stats.speedup,
    )


def convert_file(
    path: str,
    out: str,
    source: Source,
    fmt: Format,
    config: ConvertConfig = ConvertConfig(),
    progress: Callable[[Iterable], Iterable] = iter,
) -> dict:
    """Convert ``path`` into ``out`` (JSONL chat rows) and ``out.report.json``; the report.

    Both files are written whole or not at all. ``progress`` wraps the row iterator.
    """
    outcomes: list[Outcome] = []

    def converted() -> Iterator[dict]:
        for line, row in progress(read_rows(path)):
            if isinstance(row, RowError):
                outcomes.append(Outcome(line, None, None, reason="unreadable", detail=str(row)))
                continue
            for outcome in convert_row(row, line, source, fmt, config):
                outcomes.append(outcome)
                if outcome.row is not None:
                    yield outcome.row

    try:
        write_jsonl(out, converted())
    except BaseException:
        if os.path.exists(out + ".tmp"):  # what write_jsonl had begun; ``out`` itself is untouched
            os.remove(out + ".tmp")
        raise
    stats = report(outcomes, source, config)
    write_json(out + ".report.json", stats)
    return stats


def report(outcomes: list[Outcome], source: Source, config: ConvertConfig) -> dict:
    kept = [o for o in outcomes if o.row is not None]
    dropped = Counter(o.reason for o in outcomes if o.reason is not None)
    return {
        "source": source,
        "rows": len(outcomes),
        "converted": len(kept),
        "dropped": {reason: dropped[reason] for reason in REASONS if dropped[reason]},
        "blocks": sum(o.blocks for o in kept),
        "threads": sum(o.threads for o in kept),
        "max_depth": max((o.depth for o in kept), default=0),
        "sequential": sum(not o.blocks for o in kept),
        "mean_speedup": mean(o.speedup for o in kept) if kept else None,
        "config": asdict(config),
        "dropped_rows": [
            {
                "line": o.line,
                "id": o.id,
                **({} if o.sample is None else {"sample": o.sample}),
                "reason": o.reason,
                "detail": o.detail,
            }
            for o in outcomes
            if o.reason is not None
        ],
    }


def format_report(stats: dict) -> str:
    speedup = stats["mean_speedup"]
    lines = [
        f"rows                 {stats['rows']} ({stats['source']})",
        f"converted            {stats['converted']} ({stats['sequential']} sequential)",
        f"blocks kept          {stats['blocks']} ({stats['threads']} threads, nested up to {stats['max_depth']} deep)",
        "mean speedup         " + ("-" if speedup is None else f"{speedup:.3f}x"),
    ]
    lines += [f"dropped, {reason:<19}{count}" for reason, count in stats["dropped"].items()]
    return "\n".join(lines)
