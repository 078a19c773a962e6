"""What every source's conversion shares: the reasons, the settings, the tag lexer, the block
grammar each source fills in (:class:`Syntax`) and the converter that reads it, and the row fields."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from threadweaver.cli_args import SettingError, option
from threadweaver.format import block_text
from threadweaver.jsonl import json_kind
from threadweaver.rows import chatml_turns
from threadweaver.tree import DEFAULT_MAX_DEPTH

Source = Literal["multiverse", "reference", "npr"]
SOURCES: tuple[Source, ...] = get_args(Source)

Reason = Literal[
    "unreadable",  # the line is not a JSON object (JSONL) or the row not an object
    "no_text",  # no trajectory text in the row
    "no_problem",  # no problem text in the row
    "no_final",  # no final answer text after the reasoning, where the source has one apart (Multiverse)
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
            raise SettingError("max_depth", f"must be at least 1, not {self.max_depth}")
        if self.text_field == "":
            raise SettingError("text_field", "is empty: name the rows' field that holds the text")


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
class Syntax:
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


class Converter:
    """One source text to ours; raises :class:`Refused` at the first fault."""

    def __init__(self, text: str, syntax: Syntax, max_depth: int):
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
        self.deepest = (0, 0)  # (depth, character) of the last block entered
        try:
            return self.sequence(0, "", None)[0]
        except RecursionError:  # a max_depth of a few hundred, past Python's stack: a hostile row, not a crash
            depth, pos = self.deepest
            raise Refused(
                "too_deep", f"the block at character {pos} is nested {depth} deep, too deep to read"
            ) from None

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
        self.deepest = (depth, start.pos)
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
        text = block_text(outlines, threads, lead=pre)
        return (text + "\n" + join, True) if join else (text, False)


# ---- rows ----


_FIELDS_NAMED = 12
"""The most of a row's fields a missing field's message names."""


def field_text(row: dict, name: str, reason: Reason) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        kind = json_kind(value)
        found = "missing" if name not in row else "empty" if isinstance(value, str) else kind  # kind: null too
        fields = ", ".join(repr(k) for k in list(row)[:_FIELDS_NAMED]) + (", ..." if len(row) > _FIELDS_NAMED else "")
        has = f" (the row has {fields})" if name not in row and row else ""
        raise Refused(reason, f"field {name!r} is {found}, not text{has}")
    return value


def answer_field(row: dict, *names: str) -> dict:
    for name in names:
        value = row.get(name)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value).strip():
            return {"answer": str(value)}
    return {}


def row_id(row: dict) -> dict:
    value = row.get("id") if row.get("id") is not None else row.get("uuid")
    return {"id": str(value)} if isinstance(value, (str, int)) and str(value) else {}


def rendered_chat(text: str) -> tuple[list[dict], str]:
    """A rendered ChatML conversation: (the turns before the last assistant turn, its content)."""
    turns = chatml_turns(text)
    last = max((k for k, t in enumerate(turns) if t["role"] == "assistant"), default=None)
    if last is None:
        raise Refused("no_assistant", f"no assistant turn in the {len(turns)} rendered chat turns")
    if not any(t["role"] == "user" for t in turns[:last]):
        raise Refused("no_problem", "no user turn before the assistant's in the rendered chat")
    return turns[:last], turns[last]["content"]


def think_content(reasoning: str, answer: str) -> str:
    return f"<think>\n{reasoning.strip()}\n</think>\n{answer.strip()}"


def assistant_turn(content: str) -> dict:
    return {"role": "assistant", "content": content}
