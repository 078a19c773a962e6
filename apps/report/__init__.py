"""Latency statistics over JSONL trajectory files (``threadweaver stats``).

A row the orchestrator wrote is read as it decoded it (:mod:`threadweaver.decoded`), so
the statistics equal the ones it recorded. Other rows are parsed as text.
``ref.longest`` in the table is the reference implementation's longest-thread count on
the response (see :mod:`threadweaver.stats`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from statistics import mean

from threadweaver.cli_args import is_finite, is_number
from threadweaver.decoded import read_decoded
from threadweaver.jsonl import RowError, read_jsonl, row_name, row_sample
from threadweaver.rows import RowReader
from threadweaver.stats import LatencyStats, speedup
from threadweaver.tree import TrajectoryFormatError
from threadweaver.wall_clock import WallClock, format_parts, mean_parts


@dataclass(frozen=True)
class RowStats:
    line: int
    id: str
    stats: LatencyStats
    faults: tuple[str, ...]
    """The row's recorded degradations, or the parse's faults."""
    wall_clock: dict | None = None
    """Where its seconds went, as ``generate`` recorded it (:mod:`threadweaver.wall_clock`)."""
    sample: int = 0
    """Which sample of its problem (``generate --n``, lm-eval's repeats) the row is."""

    def as_dict(self) -> dict:
        head = {"line": self.line, "id": self.id, "sample": self.sample}
        return {**head, **self.stats.as_dict(), "faults": list(self.faults)}


def file_stats(
    path: str, reader: RowReader, *, strict: bool = False, on_torn: Callable[[int], None] | None = None
) -> Iterator[RowStats]:
    """Per row, the statistics of its trajectory; a bad row raises :class:`RowError` naming its line
    (``on_torn``: as :func:`~threadweaver.jsonl.read_jsonl` takes it)."""
    for line, row in read_jsonl(path, on_torn):
        try:
            yield row_stats(row, line, reader, strict=strict)
        except TrajectoryFormatError as err:
            raise RowError.at(line, err) from None


def row_stats(row: dict, line: int, reader: RowReader, *, strict: bool = False) -> RowStats:
    """The statistics of one row's trajectory. A row the strict parse refuses raises
    :class:`TrajectoryFormatError`; a row with bad fields, or one even the lenient parse cannot read
    (blocks nested past the recursion limit), :class:`RowError` naming its line."""
    try:
        decoded, sample = read_decoded(row, reader, strict=strict), row_sample(row)
    except TrajectoryFormatError as err:
        if strict:
            raise
        raise RowError.at(line, err) from None
    except ValueError as err:
        raise RowError.at(line, err) from None
    faults = tuple(f.text for f in decoded.faults)
    return RowStats(line, row_name(row, line), decoded.stats, faults, _wall_clock(row, line), sample)


def _wall_clock(row: dict, line: int) -> dict | None:
    clock = row.get("wall_clock")
    if clock is None:
        return None
    names = ("total_s", *WallClock.PARTS)
    if not isinstance(clock, dict) or not all(_is_seconds(clock.get(n)) for n in names):
        raise RowError(line, f"field 'wall_clock' must hold the finite numbers {', '.join(names)}", shape=True)
    return clock


def _is_seconds(value) -> bool:
    return is_number(value) and is_finite(value)


def summary(rows: Iterable[RowStats]) -> dict:
    rows = list(rows)
    if not rows:
        return {"rows": 0}
    total = mean(r.stats.total_tokens for r in rows)
    critical = mean(r.stats.critical_path_tokens for r in rows)
    return {
        "rows": len(rows),
        "mean_total_tokens": total,
        "mean_critical_path_tokens": critical,
        "mean_speedup": mean(r.stats.speedup for r in rows),
        "speedup_of_means": speedup(total, critical),
        "parallel_activation_ratio": mean(r.stats.blocks > 0 for r in rows),
        "well_formed_ratio": mean(not r.faults for r in rows),
        "mean_parallel_ratio": mean(r.stats.parallel_ratio for r in rows),
        "mean_wall_clock": mean_parts([r.wall_clock for r in rows if r.wall_clock is not None]),
    }


def format_table(rows: list[RowStats]) -> str:
    header = (
        f"{'id':<16}{'sample':>7}{'total':>8}{'critical':>10}{'speedup':>9}{'ref.longest':>13}{'blocks':>8}  threads  "
        "faults"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        s = r.stats
        threads = ",".join(map(str, s.threads_per_block)) or "-"
        reference = "-" if s.reference_longest_thread is None else str(s.reference_longest_thread)
        lines.append(
            f"{r.id[:15]:<16}{r.sample:>7}{s.total_tokens:>8}{s.critical_path_tokens:>10}{s.speedup:>9.2f}"
            f"{reference:>13}{s.blocks:>8}  {threads:<7}  {len(r.faults)}"
        )
    return "\n".join(lines)


def format_summary(stats: dict) -> str:
    if not stats.get("rows"):
        return "no rows"
    return "\n".join(
        [
            f"rows                      {stats['rows']}",
            f"mean total tokens         {stats['mean_total_tokens']:.1f}",
            f"mean critical-path tokens {stats['mean_critical_path_tokens']:.1f}",
            f"mean speedup              {stats['mean_speedup']:.3f}x",
            f"speedup of the means      {stats['speedup_of_means']:.3f}x",
            f"parallel activation       {stats['parallel_activation_ratio']:.1%}",
            f"well-formed               {stats['well_formed_ratio']:.1%}",
            *(
                [f"mean wall-clock           {format_parts(stats['mean_wall_clock'])}"]
                if stats["mean_wall_clock"]
                else []
            ),
        ]
    )
