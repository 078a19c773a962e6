"""Latency statistics over JSONL trajectory files (``threadweaver stats``).

``ref.longest`` in the table is the reference implementation's longest-thread count on
the response (see :mod:`threadweaver.stats`), shown for one-level trajectories.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from statistics import mean

from threadweaver.jsonl import RowError, read_jsonl
from threadweaver.rows import RowReader
from threadweaver.stats import LatencyStats, latency_stats, speedup
from threadweaver.tree import parse


@dataclass(frozen=True)
class RowStats:
    line: int
    id: str
    stats: LatencyStats
    faults: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"line": self.line, "id": self.id, **self.stats.as_dict(), "faults": list(self.faults)}


def file_stats(path: str, reader: RowReader, *, strict: bool = False) -> Iterator[RowStats]:
    """Per row, the statistics of its trajectory; a bad row raises :class:`RowError` naming its line."""
    for line, row in read_jsonl(path):
        try:
            parsed = parse(reader.trajectory(row), reader.fmt, strict=strict)
        except ValueError as err:  # TrajectoryFormatError included
            raise RowError(line, str(err)) from None
        yield RowStats(line, str(row.get("id", line)), latency_stats(parsed.nodes), tuple(map(str, parsed.faults)))


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
    }


def format_table(rows: list[RowStats]) -> str:
    header = f"{'id':<16}{'total':>8}{'critical':>10}{'speedup':>9}{'ref.longest':>13}{'blocks':>8}  threads  faults"
    lines = [header, "-" * len(header)]
    for r in rows:
        s = r.stats
        threads = ",".join(map(str, s.threads_per_block)) or "-"
        reference = "-" if s.reference_longest_thread is None else str(s.reference_longest_thread)
        lines.append(
            f"{r.id[:15]:<16}{s.total_tokens:>8}{s.critical_path_tokens:>10}{s.speedup:>9.2f}"
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
        ]
    )
