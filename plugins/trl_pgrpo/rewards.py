"""TRL reward functions for P-GRPO: correctness and acceleration, two functions so that
TRL logs each part (``rewards/correctness/mean``, ``rewards/acceleration/mean``).

Both read the gold answer from the dataset column ``answer``; the acceleration term reads
the ``trajectory_stats`` that :class:`~threadweaver.trl_pgrpo.PGRPOTrainer`'s rollouts
attach, and is paid only for a correct answer. Grades are cached, so the second function
and the trainer's ``correct_rate`` do not grade an answer again.
"""

from __future__ import annotations

from collections.abc import Callable

from threadweaver.reward import RewardConfig, acceleration, answer_text, is_correct

GOLD_COLUMN = "answer"
_NOT_COLUMNS = (
    "prompts",
    "completion_ids",
    "trajectory_stats",
    "trainer_state",
    "log_extra",
    "log_metric",
    "environments",
)
"""What TRL and the rollouts pass a reward function beside the dataset's own columns."""


def completion_text(completion) -> str:
    """A TRL completion (a string, or a conversation ending in the assistant's turn) as text."""
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"]


def reads_gold(reward_func) -> bool:
    """Whether a reward function grades against the ``answer`` column (those of :func:`pgrpo_rewards` do)."""
    return getattr(reward_func, "reads_gold", False)


def _golds(kwargs: dict, who: str) -> list[str]:
    if GOLD_COLUMN not in kwargs:
        columns = sorted(k for k in kwargs if k not in _NOT_COLUMNS)
        raise ValueError(f"{who} needs the gold answer in a dataset column {GOLD_COLUMN!r}; the rows have {columns}")
    golds = []
    for i, gold in enumerate(kwargs[GOLD_COLUMN]):
        try:
            golds.append(answer_text(gold))
        except ValueError as err:  # as text, None or nan would be matched by \boxed{None} or \boxed{nan}
            raise ValueError(f"{who}: the {GOLD_COLUMN!r} of the batch's row {i} {err}") from None
    return golds


def pgrpo_rewards(config: RewardConfig = RewardConfig()) -> list[Callable]:
    """``[correctness, acceleration]`` for ``GRPOTrainer(reward_funcs=...)``."""

    def correctness(completions, **kwargs) -> list[float]:
        golds = _golds(kwargs, "the correctness reward")
        return [float(is_correct(completion_text(c), g, config.timeout_s)) for c, g in zip(completions, golds)]

    def acceleration_reward(completions, **kwargs) -> list[float]:
        golds = _golds(kwargs, "the acceleration reward")
        stats = kwargs.get("trajectory_stats")
        if stats is None:
            raise ValueError(
                "the acceleration reward needs the rollouts' trajectory_stats: train with PGRPOTrainer, "
                "whose fork-join rollouts attach them"
            )
        return [
            acceleration(s["total_tokens"], s["critical_path_tokens"], config)
            if is_correct(completion_text(c), g, config.timeout_s)
            else 0.0
            for c, g, s in zip(completions, golds, stats)
        ]

    acceleration_reward.__name__ = "acceleration"
    correctness.reads_gold = acceleration_reward.reads_gold = True
    return [correctness, acceleration_reward]
