"""A trajectory row read as the orchestrator decoded it (``threadweaver generate``, the lm-eval
model's ``trajectories=``, a P-GRPO rollout dump), or parsed as text where nothing says more.

Its ``injected`` positions rebuild its tree and say which ``</Thread>`` the orchestrator closed,
its ``concurrent_threads`` its critical path, and its recorded degradations are its faults, so
its statistics equal the ones it recorded. ``threadweaver stats`` and ``threadweaver view`` read
rows through :func:`read_decoded`, so they agree on every row.
"""

from __future__ import annotations

from dataclasses import dataclass

from threadweaver.cli_args import is_whole
from threadweaver.layout import ThreadPath, spans
from threadweaver.rows import RowReader
from threadweaver.stats import LatencyStats, latency_stats
from threadweaver.tree import Parsed, parse


@dataclass(frozen=True)
class RowFault:
    position: int | None
    kind: str
    """``format`` for a parse fault, else the orchestrator's degradation kind."""
    text: str


@dataclass(frozen=True)
class DecodedRow:
    ids: list[int]
    parsed: Parsed
    generated: list[bool]
    """Per trajectory token: False where the orchestrator injected it."""
    recorded: bool
    """Whether the row says which tokens were injected (an orchestrator wrote it)."""
    closed: frozenset[ThreadPath]
    """The threads whose ``</Thread>`` the orchestrator closed."""
    stats: LatencyStats
    faults: tuple[RowFault, ...]
    """The recorded degradations, or the parse's faults."""


def read_decoded(row: dict, reader: RowReader, *, strict: bool = False) -> DecodedRow:
    """One row's trajectory. A row with bad fields raises :class:`ValueError` naming the field;
    one the strict parse refuses, :class:`~threadweaver.tree.TrajectoryFormatError`."""
    ids = reader.trajectory(row)
    from_token_ids = "token_ids" in row and "completion_ids" not in row  # the field reader.trajectory read
    if from_token_ids and isinstance(row.get("text"), str) and reader.fmt.decode(ids) != row["text"]:
        raise ValueError(  # with another tokenizer, its tags, answer and counts would be read wrong, without a word
            "its 'token_ids' decode to other text than its 'text' with this tokenizer: "
            "give the model's tokenizer with --tokenizer"
        )
    injected = _injected(row, len(ids))
    parsed = parse(ids, reader.fmt, strict=strict, injected=injected)
    generated = [True] * len(ids)
    for position in injected or ():
        generated[position] = False
    tags = reader.fmt.tags
    closed = frozenset(s.path for s in spans(parsed.nodes, tags) if s.kind == "close" and not generated[s.start])
    concurrent = row.get("concurrent_threads", True) is not False
    stats = latency_stats(parsed.nodes, tags, closed_threads=closed, concurrent_threads=concurrent)
    recorded = _recorded_degradations(row)
    faults = recorded if recorded is not None else tuple(RowFault(f.position, "format", str(f)) for f in parsed.faults)
    return DecodedRow(ids, parsed, generated, injected is not None, closed, stats, faults)


def _injected(row: dict, length: int) -> set[int] | None:
    if "injected" not in row:
        return None
    positions = row["injected"]
    if not isinstance(positions, list) or not all(map(is_whole, positions)):
        raise ValueError("field 'injected' must be a list of token positions")
    outside = [p for p in positions if not 0 <= p < length]
    if outside:
        raise ValueError(f"field 'injected' holds position {outside[0]}, outside the {length} trajectory tokens")
    return set(positions)


def _recorded_degradations(row: dict) -> tuple[RowFault, ...] | None:
    if "degradations" not in row:
        return None
    recorded = row["degradations"]
    if not isinstance(recorded, list) or not all(
        isinstance(d, dict) and isinstance(d.get("text"), str) and isinstance(d.get("kind"), str) for d in recorded
    ):
        raise ValueError("field 'degradations' must be a list of {kind, path, position, detail, text}")
    return tuple(RowFault(d.get("position"), d["kind"], d["text"]) for d in recorded)
