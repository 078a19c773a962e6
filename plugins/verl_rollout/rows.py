"""A trajectory as verl rows: one per engine request, in the order the engine answered.

Each row's prompt + response is exactly that request's context + completion, so verl's
actor recomputes every token's log-prob in the context it was sampled in, with its plain
causal attention. Injected tokens (``<Thread>`` + seed, ``</Parallel>``) live only in
the contexts, never in a response. The row of the request that ended the trajectory
comes last: verl's v1 trainer scores a session by its last row and gives every row its
GRPO advantage. All rows carry the same ``extra_fields`` keys (verl stacks them across
a batch); the last row's reach the reward function as ``extra_info``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from threadweaver.format import Format
from threadweaver.orchestrator import Trajectory, trajectory_text

PREFIX = "threadweaver_"


@dataclass(frozen=True)
class Row:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    extra_fields: dict[str, Any] = field(default_factory=dict)


def trajectory_fields(trajectory: Trajectory, fmt: Format) -> dict[str, Any]:
    """What the reward and the logs need to know about the whole trajectory."""
    stats = trajectory.stats
    return {
        PREFIX + "text": trajectory_text(trajectory, fmt),
        PREFIX + "total_tokens": stats.total_tokens,
        PREFIX + "critical_path_tokens": stats.critical_path_tokens,
        PREFIX + "blocks": stats.blocks,
        PREFIX + "well_formed": trajectory.well_formed,
        PREFIX + "degradations": "; ".join(map(str, trajectory.degradations)),
        PREFIX + "degradation_kinds": ",".join(sorted(trajectory.degradation_kinds)),
        PREFIX + "finish_reason": trajectory.finish_reason,
        PREFIX + "requests": len(trajectory.requests),
    }


def trajectory_rows(trajectory: Trajectory, fmt: Format) -> list[Row]:
    """The rows for one trajectory, from the calls its orchestrator kept (``keep_calls``).

    Requests that generated nothing make no row; if none generated anything (the first
    request failed), one row with the prompt and an untrained end-of-sequence token keeps
    the session in its GRPO group."""
    fields = trajectory_fields(trajectory, fmt)
    rows = [
        Row(
            list(c.context),
            list(c.completion),
            [1] * len(c.completion),
            list(c.logprobs) if c.logprobs is not None else None,
            dict(fields, **{PREFIX + "request": i}),
        )
        for i, c in enumerate(trajectory.calls)
        if c.completion
    ]
    if not rows:
        eos = min(fmt.eos_ids)
        rows = [Row(list(trajectory.prompt_ids), [eos], [0], None, dict(fields, **{PREFIX + "request": -1}))]
    return rows
