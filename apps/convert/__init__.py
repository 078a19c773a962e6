"""Peers' parallel datasets in our format (``threadweaver convert IN OUT --from SOURCE``).

Each source's rows become our chat rows ``{"id", "messages": [..., {"role": "assistant",
"content": "<think>\\n...</think>\\n..."}], "answer"?}`` that ``threadweaver sft`` reads, or a
typed :data:`Reason` naming what could not convert. Every converted row passes our strict parser
(:func:`threadweaver.tree.parse_text`, ``strict=True``) with the target tokenizer.

Each source's shape, as read (for facts only) in the peer's published code, and its mapping
to ours, is in the module doc of its own file: :mod:`.multiverse`, :mod:`.reference`,
:mod:`.npr`. What they share (the reasons, the tag lexer, the block grammar and its
converter) is in :mod:`.grammar`; files and the report in :mod:`.files`.

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

from .files import (
    CONVERTERS,
    SYNTAXES,
    NothingConverted,
    Outcome,
    convert_file,
    convert_row,
    convert_text,
    format_report,
    report,
    samples,
)
from .grammar import FIELDS, REASONS, SOURCES, ConvertConfig, Failure, Reason, Refused, Source
from .multiverse import convert_multiverse
from .npr import NPR_INSTRUCTION, convert_npr
from .reference import convert_reference

__all__ = [
    "CONVERTERS",
    "FIELDS",
    "NPR_INSTRUCTION",
    "REASONS",
    "SOURCES",
    "SYNTAXES",
    "ConvertConfig",
    "Failure",
    "NothingConverted",
    "Outcome",
    "Reason",
    "Refused",
    "Source",
    "convert_file",
    "convert_multiverse",
    "convert_npr",
    "convert_reference",
    "convert_row",
    "convert_text",
    "format_report",
    "report",
    "samples",
]
