"""Which of a model's own trajectories train the next one (``threadweaver filter``, stage 2 of the data).

From ``threadweaver generate --n K`` rows on problems with answers, a trajectory is kept when it
is, in this order of checks:

1. graded: its row has the problem's ``answer``;
2. well-formed: the strict parse takes it and the orchestrator recorded no degradation (as
   :mod:`threadweaver.metrics` says it for every host);
3. not truncated: it ended by itself (``finish_reason`` stop), not at a token limit, the timeout or an engine
   failure;
4. correct: its last boxed answer equals ``answer`` (:func:`threadweaver.reward.grade`);
5. parallel: it has a block (unless sequential ones are kept too);
6. no longer than ``max_tokens``.

A line that cannot be read (not a JSON object, or a field that is not what ``generate`` writes) is
dropped as ``unreadable``, naming why, and the rest are judged; where no line can be read, the first
one's :class:`~threadweaver.jsonl.RowError` is raised.

Then at most ``per_problem`` trajectories per problem (the rows' ``id``; rows without one, by prompt) stay, best speedup
first. A dropped row has one reason: the first check it fails. Kept rows pass through as they
are: their token ids are what the model sampled, so nothing is re-tokenised, and
``threadweaver sft`` reads them (``prompt_ids`` + ``token_ids``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from statistics import mean
from typing import Literal, get_args

from threadweaver.cli_args import SettingError, option
from threadweaver.jsonl import RowError, read_rows
from threadweaver.orchestrator import FINISH_REASONS
from threadweaver.report import row_stats
from threadweaver.reward import grade, row_answer
from threadweaver.rows import RowReader
from threadweaver.tree import TrajectoryFormatError

Reason = Literal[
    "unreadable", "no_answer", "malformed", "degraded", "truncated", "wrong", "sequential", "too_long", "per_problem"
]
REASONS: tuple[Reason, ...] = get_args(Reason)


@dataclass(frozen=True)
class FilterConfig:
    per_problem: int = option(1, "Most trajectories kept per problem, best speedup first.")
    max_tokens: int | None = option(
        None, "Drop trajectories that generated more than this many tokens, all threads' together (default: no limit)."
    )
    keep_sequential: bool = option(False, "Keep correct trajectories with no parallel block too.")

    def __post_init__(self):
        if self.per_problem < 1:
            raise SettingError("per_problem", f"must be at least 1, not {self.per_problem}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise SettingError("max_tokens", f"must be at least 1, not {self.max_tokens}")


@dataclass(frozen=True)
class Verdict:
    """What the filter found in one row."""

    line: int
    problem: str
    reason: Reason | None
    """The first check the row fails; ``None``: it passed them all (the per-problem cap comes after)."""
    correct: bool
    well_formed: bool
    parallel: bool
    speedup: float
    detail: str = ""
    """Why it is malformed or wrong, or which degradation it has."""


def judge(row: dict, line: int, reader: RowReader, config: FilterConfig) -> Verdict:
    """One row's verdict; a row with bad fields raises :class:`~threadweaver.jsonl.RowError` naming its line."""
    try:
        stats, malformed = row_stats(row, line, reader, strict=True), ""
    except TrajectoryFormatError as err:
        stats, malformed = row_stats(row, line, reader), str(err)
    answer = row_answer(row, line) if row.get("answer") is not None else None  # graded as the rewards grade it
    text = reader.fmt.decode(reader.trajectory(row))
    graded = grade(text, answer) if answer is not None else None
    correct = bool(graded and graded.correct)
    finish = row.get("finish_reason", "stop")  # a row from elsewhere may not say: taken as ended by itself
    if finish not in FINISH_REASONS:
        raise RowError(line, f"field 'finish_reason' must be one of {', '.join(FINISH_REASONS)}, not {finish!r}", True)
    truncated = finish != "stop"  # a token limit, the timeout or an engine failure cut it
    checks: list[tuple[Reason, bool, str]] = [
        ("no_answer", answer is None, "the row has no 'answer' to grade against"),
        ("malformed", bool(malformed), malformed),
        ("degraded", bool(stats.faults), "; ".join(stats.faults)),
        ("truncated", truncated, f"it did not end by itself (finish_reason {finish})"),
        ("wrong", not correct, graded.detail if graded else ""),
        ("sequential", not config.keep_sequential and stats.stats.blocks == 0, "no parallel block"),
        ("too_long", config.max_tokens is not None and stats.stats.total_tokens > config.max_tokens, ""),
    ]
    reason, detail = next(((r, d) for r, failed, d in checks if failed), (None, ""))
    well_formed = not (malformed or stats.faults)  # as every host says it: a cut one is dropped as truncated
    return Verdict(line, stats.id, reason, correct, well_formed, stats.stats.blocks > 0, stats.stats.speedup, detail)


def select(
    path: str, reader: RowReader, config: FilterConfig, progress: Callable[[Iterable], Iterable] = iter
) -> tuple[list[dict], list[Verdict], dict]:
    """(the kept rows in file order, every row's verdict, the report). ``progress`` wraps the row
    iterator (a progress bar)."""
    rows, verdicts, first_unreadable = {}, [], None
    named_by_prompt: dict[tuple[int, ...], str] = {}  # rows without an id: one problem a prompt
    for line, row in progress(read_rows(path)):
        if not isinstance(row, RowError):
            try:
                verdict = judge(row, line, reader, config)
            except RowError as err:
                row = err
        if isinstance(row, RowError):
            first_unreadable = first_unreadable or row
            detail = str(row).removeprefix(f"line {line}: ")  # the report names the line
            verdicts.append(Verdict(line, f"line-{line}", "unreadable", False, False, False, 0.0, detail))
            continue
        if row.get("id") is None:  # named as its prompt's first row is (line-N)
            verdict = replace(verdict, problem=named_by_prompt.setdefault(tuple(reader.prompt(row)), verdict.problem))
        verdicts.append(verdict)
        if verdict.reason is None:
            rows[line] = row
    candidates = defaultdict(list)
    for v in verdicts:
        if v.reason is None:
            candidates[v.problem].append(v)
    kept = set()
    for group in candidates.values():
        best = sorted(group, key=lambda v: (-v.speedup, v.line))
        kept.update(v.line for v in best[: config.per_problem])
    verdicts = [v if v.reason is not None or v.line in kept else replace(v, reason="per_problem") for v in verdicts]
    if first_unreadable and all(v.reason == "unreadable" for v in verdicts):
        raise first_unreadable
    return [rows[line] for line in sorted(kept)], verdicts, report(verdicts, config)


def report(verdicts: list[Verdict], config: FilterConfig) -> dict:
    """The counts; the shares are of the rows that could be read."""
    read = [v for v in verdicts if v.reason != "unreadable"]
    graded = [v for v in read if v.reason != "no_answer"]
    kept = [v for v in verdicts if v.reason is None]
    dropped = Counter(v.reason for v in verdicts if v.reason is not None)
    return {
        "rows": len(verdicts),
        "problems": len({v.problem for v in read}),
        "kept": len(kept),
        "problems_kept": len({v.problem for v in kept}),
        "dropped": {reason: dropped[reason] for reason in REASONS if dropped[reason]},
        "pass_at_1": mean(v.correct for v in graded) if graded else None,
        "well_formed_ratio": mean(v.well_formed for v in read) if read else None,
        "parallel_activation_ratio": mean(v.parallel for v in read) if read else None,
        "mean_speedup_kept": mean(v.speedup for v in kept) if kept else None,
        "config": config.__dict__,
        "dropped_rows": [
            {"line": v.line, "id": v.problem, "reason": v.reason, "detail": v.detail}
            for v in verdicts
            if v.reason is not None
        ],
    }


def nothing_kept(stats: dict) -> str:
    """Why a report with no row kept keeps none: its first dropped row, with its line and reason (as
    ``convert`` words a file of which no row converts)."""
    if not stats["dropped_rows"]:
        return "no row to filter"
    first = stats["dropped_rows"][0]
    why = f"{first['reason']}: {first['detail']}" if first["detail"] else first["reason"]
    return f"no row kept of {stats['rows']} (the first dropped: line {first['line']}: {why})"


def format_report(stats: dict) -> str:
    def share(x):
        return "-" if x is None else f"{x:.1%}"

    lines = [
        f"rows                 {stats['rows']} ({stats['problems']} problems)",
        f"kept                 {stats['kept']} ({stats['problems_kept']} problems)",
        f"pass@1               {share(stats['pass_at_1'])}",
        f"well-formed          {share(stats['well_formed_ratio'])}",
        f"parallel             {share(stats['parallel_activation_ratio'])}",
        "mean speedup, kept   " + ("-" if stats["mean_speedup_kept"] is None else f"{stats['mean_speedup_kept']:.3f}x"),
    ]
    lines += [f"dropped, {reason:<12}{count}" for reason, count in stats["dropped"].items()]
    return "\n".join(lines)
