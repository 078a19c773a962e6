"""The P-GRPO reward for verl: ``reward.custom_reward_function.path=pkg://threadweaver.verl_rollout.reward``.

Correctness (math-verify, safe in verl's reward threads) plus the acceleration term from
the trajectory's latency stats, paid only when correct. verl passes ``solution_str``,
the decoded response of a session's last row: for a fork-join rollout that is only the
text after the last join, so the whole trajectory's text and stats are read from
``extra_info``, where the agent loop put them. Rows from other agent loops (no stats)
get correctness on ``solution_str`` and no acceleration. The parts come back beside the
score, so verl logs each of them.

Set the reward's knobs with ``reward.custom_reward_function.reward_kwargs.<name>=...``:
``factor``, ``clip``, ``form`` and ``timeout_s``, the fields of :class:`~threadweaver.reward.RewardConfig`
(its defaults where unset). Our configs declare all four; over a config that does not (verl's own
``ppo_trainer``), add them with ``+reward.custom_reward_function.reward_kwargs.<name>=...``.
"""

from __future__ import annotations

from typing import Any

from threadweaver.metrics import trajectory_metrics
from threadweaver.reward import RewardConfig, answer_text, reward
from threadweaver.verl_rollout.rows import PREFIX

_FROM_VERL = {"reward_router_address", "reward_model_tokenizer"}
"""What verl's reward managers may add to the call; not ours to read."""


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **reward_kwargs: Any
) -> dict[str, float]:
    config = reward_config(reward_kwargs)
    gold = _gold(ground_truth)
    info = extra_info or {}
    text = info.get(PREFIX + "text", solution_str) or ""  # no response at all is no answer
    total = int(info.get(PREFIX + "total_tokens", 0))
    critical = int(info.get(PREFIX + "critical_path_tokens", total))
    parts = reward(text, gold, total, critical, config)
    kinds = info.get(PREFIX + "degradation_kinds", "").split(",")
    return {
        "score": parts.reward,
        "correct": parts.correctness,
        "acceleration": parts.acceleration,
        **trajectory_metrics(
            total, critical, int(info.get(PREFIX + "blocks", 0)), bool(info.get(PREFIX + "well_formed", True)), kinds
        ),
    }


def reward_config(reward_kwargs: dict[str, Any]) -> RewardConfig:
    """The reward's knobs from verl's ``reward_kwargs`` (and what verl adds to them); an unknown or bad one is
    refused, naming it as the config does."""
    unknown = set(reward_kwargs) - _FROM_VERL - set(RewardConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(
            f"unknown reward.custom_reward_function.reward_kwargs {sorted(unknown)}; the threadweaver reward takes "
            f"{sorted(RewardConfig.__dataclass_fields__)}"
        )
    try:
        return RewardConfig(**{k: v for k, v in reward_kwargs.items() if k not in _FROM_VERL})
    except (TypeError, ValueError) as err:
        raise type(err)(f"reward.custom_reward_function.reward_kwargs: {err}") from None


def _gold(ground_truth: Any) -> str:
    """The gold answer as text (:func:`~threadweaver.reward.answer_text`): ``str(None)`` would grade
    ``\\boxed{None}`` correct."""
    try:
        return answer_text(ground_truth)
    except ValueError as err:
        raise ValueError(
            f"ground_truth {err}: the row's gold answer (verl's reward_model.ground_truth) must be a non-empty "
            "string or a number"
        ) from None
