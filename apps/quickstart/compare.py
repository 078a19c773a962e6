"""Per-problem results of each decoding mode, the comparison table, and per-problem speedups.

Pure functions over what ``lm_eval`` logged (per-sample metrics) and the trajectories
the threadweaver model wrote (request timings, ``wall_s``); nothing here decodes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from statistics import fmean

from threadweaver.stats import speedup


@dataclass(frozen=True)
class Problem:
    doc_id: int
    acc: float
    well_formed: float
    parallel_activation: float
    """The share of this problem's trajectories with a parallel block."""
    token_latency: float
    total_tokens: float
    wall_s: float
    """Mean wall-clock seconds of this problem's trajectories (one per repeat)."""
    trajectories: tuple[dict, ...] = field(default=(), repr=False)
    cut_short: bool = False
    """Whether a response to it did not end by itself (lm-eval's ``cut_short``, the share of its repeats: a token
    limit, a timeout or an engine error cut it); unknown, where a task does not log it or the engine said no finish
    reason, counts as not."""


MEASURES = ("acc", "well_formed", "parallel_activation", "token_latency", "total_tokens", "wall_s")
"""What a problem's result and a table row hold, in this order."""


def problems(samples: list[dict], trajectories: list[dict]) -> dict[int, Problem]:
    """Join lm-eval's samples to the trajectories of the same prompt: ``{doc_id: Problem}``."""
    by_context: dict[str, list[dict]] = defaultdict(list)
    for row in trajectories:
        by_context[row["context"]].append(row)
    out = {}
    for sample in samples:
        context = sample["arguments"]["gen_args_0"]["arg_0"]
        rows = by_context.get(context)
        if not rows:
            raise ValueError(f"doc {sample['doc_id']}: no trajectory was written for its prompt")
        metrics = [sample[name] for name in MEASURES[:-1]]
        wall_s = fmean(row["wall_s"] for row in rows)
        cut = sample.get("cut_short", 0) > 0  # NaN where the engine said no finish reason
        out[sample["doc_id"]] = Problem(sample["doc_id"], *metrics, wall_s, tuple(rows), cut)
    return out


@dataclass(frozen=True)
class Row:
    label: str
    acc: float
    well_formed: float
    parallel_activation: float
    token_latency: float
    total_tokens: float
    wall_s: float
    token_speedup: float
    """The reference's mean total tokens over this mode's mean token latency."""
    wall_speedup: float
    """The reference's mean wall-clock per problem over this mode's."""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _mean(results: dict[int, Problem], name: str) -> float:
    return fmean(getattr(p, name) for p in results.values())


def _shared(runs: dict[str, dict[int, Problem]]) -> set[int]:
    """The problems every mode has a result for: what the table and its notes compare."""
    return set.intersection(*(set(results) for results in runs.values()))


def table(runs: dict[str, dict[int, Problem]], labels: dict[str, str], reference: str) -> list[Row]:
    """One row per mode; speedups are against ``reference`` (ratios of means, on the same problems)."""
    shared = _shared(runs)
    runs = {key: {d: results[d] for d in shared} for key, results in runs.items()}
    ref = runs[reference]
    rows = []
    for key, results in runs.items():
        means = dict(zip(MEASURES, (_mean(results, name) for name in MEASURES)))
        token_speedup = speedup(_mean(ref, "total_tokens"), means["token_latency"])
        rows.append(Row(labels[key], *means.values(), token_speedup, speedup(_mean(ref, "wall_s"), means["wall_s"])))
    return rows


def cut_short_note(runs: dict[str, dict[int, Problem]], labels: dict[str, str]) -> str | None:
    """A line under the table where responses did not end by themselves, or None: a cut response's token count is
    not a solution's, so a speedup over a cut reference says little about the method."""
    shared = _shared(runs)
    cut = {key: sum(results[d].cut_short for d in shared) for key, results in runs.items()}
    said = [f"{n} of {len(shared)} problems ({labels[key]})" for key, n in cut.items() if n]
    if not said:
        return None
    return (
        f"responses that did not end by themselves (a token limit, a timeout or an engine error cut them), on "
        f"{' and '.join(said)}: a cut response's token count is not a solution's, so the token counts and speedups "
        "of those rows, and against them, say little"
    )


def per_problem_speedups(run: dict[int, Problem], reference: dict[int, Problem]) -> dict[str, list[float]]:
    """Per shared problem: ``tokens`` (reference total / token latency) and ``wall`` (reference wall / wall)."""
    shared = sorted(set(run) & set(reference))
    return {
        "tokens": [speedup(reference[d].total_tokens, run[d].token_latency) for d in shared],
        "wall": [speedup(reference[d].wall_s, run[d].wall_s) for d in shared],
    }


def format_table(rows: list[Row], reference_label: str) -> str:
    headers = (
        "decoding",
        "accuracy",
        "well-formed",
        "forked",
        "token latency",
        "total tokens",
        "token-latency speedup",
        "wall-clock / problem",
        "wall-clock speedup",
    )
    cells = [
        (
            r.label,
            f"{r.acc:.1%}",
            f"{r.well_formed:.1%}",
            f"{r.parallel_activation:.0%}",
            f"{r.token_latency:.1f}",
            f"{r.total_tokens:.1f}",
            f"{r.token_speedup:.2f}x",
            f"{r.wall_s * 1000:.0f} ms",
            f"{r.wall_speedup:.2f}x",
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]

    def line(values):
        return (
            "| "
            + " | ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths)))
            + " |"
        )

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join(
        [
            line(headers),
            rule,
            *map(line, cells),
            f"speedups are against the {reference_label} (its mean total tokens and wall-clock)",
        ]
    )
