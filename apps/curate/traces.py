"""Sequential traces in: the rows ``curate`` reads, and the units a trace is cut into.

A row gives the problem, the assistant's full response (``<think>`` reasoning ``</think>``
then the final answer text) and the gold answer, in any of these shapes:

* chat: ``messages`` with a user turn and a last assistant turn, and ``answer``; the turns before
  the assistant's (a system turn, earlier turns) stay the prompt of the curated row;
* flat: ``problem`` (or ``prompt``/``question``) and ``response`` (or ``completion``), or
  ``reasoning`` and ``final`` apart, and ``answer`` (or ``gold``);
* ``threadweaver generate --no-branching`` output: ``text``, ``prompt_ids`` (the problem is the
  last user turn of the decoded chat prompt, whose turns are the curated row's prompt) and ``answer``.

The response is ``<think>`` reasoning ``</think>`` answer, or, as DeepSeek-R1 and its distillations
write it (their chat template opens ``<think>`` in the prompt), reasoning ``</think>`` answer.
Every other field of the row (``source``, ``difficulty``, ...) is kept in the curated row, but
those that hold the sequential response in another form (:data:`RESPONSE_FIELDS`).

The reasoning is cut into units: a unit is one line that has text, with the newline that ends it
and any blank lines after it, so the units tile the reasoning exactly (blank lines before the
first unit stay in ``lead``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from threadweaver.format import THINK, THINK_END
from threadweaver.jsonl import RowError, row_name
from threadweaver.rows import TOKENIZER_FIELD, RowReader, chatml_turns

PROBLEM_FIELDS = ("messages", "problem", "prompt", "question", "prompt_ids")
RESPONSE_FIELDS = (
    *("response", "completion", "text", "reasoning", "final", "token_ids", "completion_ids"),
    # the rest of a ``generate`` row's record of the sequential trajectory (threadweaver.batch.trajectory_row)
    *("injected", "tree", "requests", "stats", "degradations", "finish_reason", "wall_s", "wall_clock"),
    "concurrent_threads",
    TOKENIZER_FIELD,  # the tokenizer the row was written with; not the curated row's
)
"""Fields that hold or describe the sequential response: a curated row has its own."""
ANSWER_FIELDS = ("answer", "gold")


@dataclass(frozen=True)
class Trace:
    id: str
    line: int
    """Line (JSONL) or row number (parquet, 1-based) in the input."""
    problem: str
    lead: str
    """Blank lines between ``<think>`` and the first unit."""
    units: tuple[str, ...]
    final: str
    """Everything after ``</think>``: the answer text, kept as it is."""
    answer: str
    """The gold answer."""
    prompt: tuple[dict, ...] = ()
    """The chat turns before the response (a system turn, the user's), as the row gives them."""
    fields: dict = field(default_factory=dict)
    """The row's other fields (not its id, problem, response or answer), kept in the curated row."""

    @property
    def reasoning(self) -> str:
        return self.lead + "".join(self.units)

    @property
    def response(self) -> str:
        return f"{THINK}{self.reasoning}{THINK_END}{self.final}"


def split_units(reasoning: str) -> tuple[str, tuple[str, ...]]:
    """(leading whitespace, units); ``lead + "".join(units) == reasoning``."""
    lead, units = "", []
    for line in re.split(r"(?<=\n)", reasoning):
        if line.strip():
            units.append(line)
        elif units:
            units[-1] += line
        else:
            lead += line
    return lead, tuple(units)


def to_trace(row: dict, line: int, reader: RowReader | None = None) -> Trace:
    """One row as a trace, its ``prompt_ids`` read by ``reader``; a row it cannot read raises
    :class:`RowError` naming the field."""
    prompt, response = _prompt_and_response(row, line, reader)
    answer = _first(row, ANSWER_FIELDS)
    if answer is None:
        raise RowError(line, "no gold answer: give an 'answer' (or 'gold') field")
    start, end = response.find(THINK), response.rfind(THINK_END)
    if end < 0 or start > end:
        cut = " (it was cut off: finish_reason length)" if row.get("finish_reason") == "length" else ""
        raise RowError(
            line,
            f"the response has no {THINK}...{THINK_END} reasoning (nor reasoning ending in {THINK_END}) to rewrite"
            + cut,
        )
    lead, units = split_units(response[0 if start < 0 else start + len(THINK) : end])
    final = response[end + len(THINK_END) :]
    if reader is not None:  # `generate` text ends with the end-of-turn token, which the trainer adds again
        for eos in reader.fmt.eos_ids:
            final = final.removesuffix(reader.fmt.decode([eos]))
    problem = next(t["content"] for t in reversed(prompt) if t.get("role") == "user")
    taken = {"id", *PROBLEM_FIELDS, *RESPONSE_FIELDS, *ANSWER_FIELDS}
    fields = {k: v for k, v in row.items() if k not in taken}
    return Trace(row_name(row, line), line, problem, lead, units, final, str(answer), prompt, fields)


def _prompt_and_response(row: dict, line: int, reader: RowReader | None) -> tuple[tuple[dict, ...], str]:
    """(the turns before the response, ending with the problem's user turn; the response)."""
    messages = row.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise RowError(line, "'messages' must be a list of {role, content} objects")
        users = [m for m in messages if m.get("role") == "user"]
        if not users or messages[-1].get("role") != "assistant":
            raise RowError(line, "'messages' needs a user turn and, last, the assistant's response")
        _text(users[-1].get("content"), line, "messages[user].content")
        response = _text(messages[-1].get("content"), line, "messages[assistant].content")
        return tuple(dict(m) for m in messages[:-1]), response
    problem = _first(row, ("problem", "prompt", "question"))
    if problem is None and "prompt_ids" in row and reader is not None:
        turns = chatml_turns(_prompt_text(row, line, reader))
        users = [k for k, turn in enumerate(turns) if turn["role"] == "user"]
        if not users:
            raise RowError(line, "'prompt_ids' decode to no user turn (<|im_start|>user ... <|im_end|>)")
        prompt = tuple(turns[: users[-1] + 1])  # not the assistant turn the prompt opens
    elif problem is None:
        raise RowError(line, "no problem: give 'messages', 'problem' (or 'prompt'/'question'), or 'prompt_ids'")
    else:
        prompt = ({"role": "user", "content": _text(problem, line, "problem")},)
    response = _first(row, ("response", "completion", "text"))
    if response is None and "reasoning" in row:
        reasoning, final = _text(row["reasoning"], line, "reasoning"), _text(row.get("final", ""), line, "final")
        response = f"{THINK}{reasoning}{THINK_END}{final}"
    if response is None:
        raise RowError(line, "no response: give 'response' (or 'completion'/'text'), or 'reasoning' and 'final'")
    return prompt, _text(response, line, "response")


def _prompt_text(row: dict, line: int, reader: RowReader) -> str:
    try:
        return reader.fmt.decode(reader.prompt(row))
    except ValueError as err:
        raise RowError.at(line, err) from None


def _first(row: dict, names: tuple[str, ...]):
    return next((row[n] for n in names if row.get(n) is not None), None)


def _text(value, line: int, field: str) -> str:
    if not isinstance(value, str):
        raise RowError(line, f"'{field}' must be text, not {type(value).__name__}")
    return value
