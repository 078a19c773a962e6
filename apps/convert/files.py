"""Converting a file: every row through its source's converter and our strict parser, and the report."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from statistics import mean

from threadweaver.format import Format
from threadweaver.jsonl import RowError, read_rows, report_path, write_json, write_jsonl
from threadweaver.rows import tokenizer_field
from threadweaver.stats import latency_stats
from threadweaver.tree import DEFAULT_MAX_DEPTH, TrajectoryFormatError, parse_text

from .grammar import FIELDS, REASONS, ConvertConfig, Converter, Failure, Reason, Source, Syntax, row_id
from .multiverse import MULTIVERSE, convert_multiverse
from .npr import NPR, convert_npr
from .reference import REFERENCE, convert_reference

SYNTAXES: dict[Source, Syntax] = {"multiverse": MULTIVERSE, "reference": REFERENCE, "npr": NPR}

CONVERTERS: dict[Source, Callable[[dict, ConvertConfig], dict | Failure]] = {
    "multiverse": convert_multiverse,
    "reference": convert_reference,
    "npr": convert_npr,
}


def convert_text(text: str, source: Source, max_depth: int = DEFAULT_MAX_DEPTH) -> str:
    """A source's trajectory text in our format (public: no caller here passes ``max_depth``);
    :class:`~threadweaver.convert.grammar.Refused` says why not."""
    return Converter(text, SYNTAXES[source], max_depth).convert()


def samples(row: dict, source: Source, config: ConvertConfig = ConvertConfig()) -> list[tuple[int | None, dict]]:
    """(sample index, row) per trajectory: NPR's list of trajectories is a row each."""
    name = config.text_field or FIELDS[source]
    if source == "npr" and isinstance(row.get(name), list) and row[name]:
        return [(k, {**row, name: t}) for k, t in enumerate(row[name])]
    return [(None, row)]


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
        rid = row_id(one).get("id")
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


class NothingConverted(ValueError):
    """No row of the input converted: nothing is written, and ``report`` says why."""

    def __init__(self, report: dict):
        message = "no row to convert"
        if report["rows"]:  # every row was dropped
            first = report["dropped_rows"][0]
            message = (
                f"no row converted (the first dropped: line {first['line']}: {first['reason']}: {first['detail']})"
            )
        super().__init__(message)
        self.report = report


def convert_file(
    path: str,
    out: str,
    source: Source,
    fmt: Format,
    config: ConvertConfig = ConvertConfig(),
    progress: Callable[[Iterable], Iterable] = iter,
) -> dict:
    """Convert ``path`` into ``out`` (JSONL chat rows) and ``out.report.json``; the report.

    Both files are written whole or not at all: where no row converts, neither is, and
    :class:`NothingConverted` carries the report. ``progress`` wraps the row iterator.
    """
    outcomes: list[Outcome] = []

    def converted() -> Iterator[dict]:
        for line, row in progress(read_rows(path)):
            if isinstance(row, RowError):
                detail = str(row).removeprefix(f"line {line}: ")  # the report names the line
                outcomes.append(Outcome(line, None, None, reason="unreadable", detail=detail))
                continue
            for outcome in convert_row(row, line, source, fmt, config):
                outcomes.append(outcome)
                if outcome.row is not None:
                    yield {**outcome.row, **tokenizer_field(fmt)}
        if not any(o.row is not None for o in outcomes):  # before write_jsonl replaces ``out``
            raise NothingConverted(report(outcomes, source, config))

    write_jsonl(out, converted())  # on an error, what it had begun goes; ``out`` itself is untouched
    stats = report(outcomes, source, config)
    write_json(report_path(out), stats)
    return stats


def report(outcomes: list[Outcome], source: Source, config: ConvertConfig) -> dict:
    kept = [o for o in outcomes if o.row is not None]
    dropped = Counter(o.reason for o in outcomes if o.reason is not None)
    return {
        "source": source,
        "rows": len({o.line for o in outcomes}),
        "trajectories": len(outcomes),  # an NPR row holds several
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
        f"rows                 {stats['rows']} ({stats['source']}"
        + (f", {stats['trajectories']} trajectories)" if stats["trajectories"] != stats["rows"] else ")"),
        f"converted            {stats['converted']} ({stats['sequential']} sequential)",
        f"blocks kept          {stats['blocks']} ({stats['threads']} threads, nested up to {stats['max_depth']} deep)",
        "mean speedup         " + ("-" if speedup is None else f"{speedup:.3f}x"),
    ]
    lines += [f"dropped, {reason:<19}{count}{_hint(reason, stats)}" for reason, count in stats["dropped"].items()]
    return "\n".join(lines)


def _hint(reason: Reason, stats: dict) -> str:
    """What to do about a reason, where the command has a flag for it."""
    if reason != "no_text":
        return ""
    name = stats["config"]["text_field"] or FIELDS[stats["source"]]
    return f" (no text in field {name!r}; --text-field NAME reads another field)"
