"""What every host reports of a decoded trajectory: the P-GRPO trainers, verl's reward and the lm-eval tasks.

* ``speedup``: generated tokens over those on the critical path (1.0 for a sequential trajectory);
* ``parallel_activation``: 1 where it has at least one block;
* ``critical_path_tokens`` and ``total_tokens``: as :mod:`threadweaver.stats` counts them;
* ``well_formed``: 1 where the orchestrator decoded it without degrading;
* ``degraded_<kind>``: 1 where it met a degradation of that kind
  (:data:`threadweaver.orchestrator.DEGRADATION_KINDS`); NaN where the kinds are not known.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from statistics import fmean

from threadweaver.orchestrator import DEGRADATION_KINDS, Trajectory
from threadweaver.stats import speedup


def trajectory_metrics(
    total_tokens: int,
    critical_path_tokens: int,
    blocks: int,
    well_formed: bool,
    degradation_kinds: Collection[str] | None,
) -> dict[str, float]:
    """One trajectory's metrics, from what a host has of it (verl's rows carry these fields, not the trajectory)."""
    return {
        "speedup": speedup(total_tokens, critical_path_tokens),
        "parallel_activation": float(blocks > 0),
        "critical_path_tokens": float(critical_path_tokens),
        "total_tokens": float(total_tokens),
        "well_formed": float(well_formed),
        **{
            f"degraded_{kind}": math.nan if degradation_kinds is None else float(kind in degradation_kinds)
            for kind in DEGRADATION_KINDS
        },
    }


def rollout_metrics(trajectories: Sequence[Trajectory], correct: Sequence[bool] | None = None) -> dict[str, float]:
    """Means of :func:`trajectory_metrics` over a batch of rollouts, and ``correct_rate`` where ``correct`` is
    given: what TRL's P-GRPO trainer logs (verl logs :func:`trajectory_metrics` per rollout)."""
    if not trajectories:
        raise ValueError("no rollouts to summarise")
    each = [
        trajectory_metrics(
            t.stats.total_tokens, t.stats.critical_path_tokens, t.stats.blocks, t.well_formed, t.degradation_kinds
        )
        for t in trajectories
    ]
    metrics = {name: fmean(m[name] for m in each) for name in each[0]}
    if correct is not None:
        metrics["correct_rate"] = fmean(map(bool, correct))
    return metrics
