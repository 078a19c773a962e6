"""``PGRPOConfig``: TRL's ``GRPOConfig`` with P-GRPO's defaults and the rollout settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from threadweaver.cli_args import SettingError, check_counts, check_numbers, is_finite, is_number
from threadweaver.engine import Sampling
from threadweaver.hf_collator.sft import check_trainer_numbers
from threadweaver.orchestrator import Limits
from threadweaver.pgrpo import PAPER
from threadweaver.reward import ACCELERATION_FORMS, RewardConfig

STD_REFUSAL = (
    "P-GRPO centres rewards on their group mean and does not divide by their std (scale_rewards none). When every "
    "rollout of a group is correct, the correctness reward cancels and only the small acceleration term is left; "
    "dividing by its std blows it up to unit scale, so speed outweighs correctness (the paper's ablation: 74.8% "
    "instead of 79.9% on AIME24, with longer trajectories)"
)

UNSAMPLED = (
    ("min_p", (None, 0.0)),
    ("repetition_penalty", (1.0,)),
    ("generation_kwargs", (None, {})),
    ("vllm_structured_outputs_regex", (None,)),
)
"""GRPOConfig's sampling settings that the rollouts do not apply, with the values that change nothing."""


def _paper(name: str, help_text: str):
    """A field whose default is the paper's setting ``name`` (:data:`threadweaver.pgrpo.PAPER`)."""
    value = getattr(PAPER, name)
    return field(default=value, metadata={"help": f"{help_text} (the paper's {value})."})


def _limit(name: str):
    """A field declared by the orchestrator's :class:`Limits`: the same default and help."""
    declared = Limits.__dataclass_fields__[name]
    return field(default=declared.default, metadata=declared.metadata)


@dataclass
class PGRPOConfig(GRPOConfig):
    """GRPO with the paper's P-GRPO settings; the fields below are the ThreadWeaver ones."""

    learning_rate: float = _paper("learning_rate", "Initial AdamW learning rate")
    num_generations: int | None = _paper("rollouts_per_prompt", "Rollouts per prompt")
    epsilon: float = _paper("clip_low", "Lower clip of the importance ratio")
    epsilon_high: float | None = _paper("clip_high", "Upper clip of the importance ratio")
    scale_rewards: str = field(
        default="none",
        metadata={"help": "Must be 'none': advantages are mean-centred per group, never divided by the std."},
    )
    temperature: float = _paper("temperature", "Rollout sampling temperature")
    max_grad_norm: float = _paper("max_grad_norm", "Gradient clipping")

    branching: bool = field(
        default=Limits.branching,
        metadata={
            "help": "Fork-join rollouts; off trains the sequential baseline: one plain request per rollout and "
            "no acceleration reward."
        },
    )
    acceleration_factor: float = _paper("acceleration_factor", "Weight of the acceleration reward")
    acceleration_clip: float = _paper("acceleration_clip", "Upper clip of the acceleration gain")
    acceleration_form: str = field(
        default=RewardConfig.form,
        metadata={
            "help": "The acceleration gain: 'reduction' is 1 - critical path / total tokens (the paper's), "
            "'ratio' is total tokens / critical path - 1.",
            "choices": ACCELERATION_FORMS,
        },
    )
    max_threads: int = _limit("max_threads")
    max_depth: int = _limit("max_depth")

    def __post_init__(self) -> None:
        # before TRL's own checks: num_generations 0 is a ZeroDivisionError there, and the others would
        # be found only once the model has loaded (by torch, the Trainer) and the first rollout starts
        # GRPO's advantages compare a prompt's rollouts: TRL refuses 1 only once the model has loaded
        check_counts(self, ("num_generations",), least=2)
        # max_completion_length 0 was transformers' "max_new_tokens must be greater than 0", after the model loaded
        check_counts(self, ("max_threads", "max_depth", "max_completion_length"))
        check_trainer_numbers(self)
        check_numbers(self, ("acceleration_factor", "acceleration_clip", "epsilon", "beta"))
        if self.epsilon_high is not None:
            check_numbers(self, ("epsilon_high",))
        self._check_reward_weights()
        Sampling(temperature=self.temperature, top_p=self.top_p, top_k=-1 if self.top_k is None else self.top_k)
        if self.scale_rewards is False:
            self.scale_rewards = "none"
        if self.scale_rewards != "none":
            raise SettingError("scale_rewards", f"is {self.scale_rewards!r}: {STD_REFUSAL}")
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise SettingError(
                "multi_objective_aggregation",
                f"is {self.multi_objective_aggregation!r}, which normalises each reward by its std before summing: "
                f"{STD_REFUSAL}",
            )
        if self.acceleration_form not in ACCELERATION_FORMS:
            forms = " or ".join(ACCELERATION_FORMS)
            raise SettingError("acceleration_form", f"must be {forms}, not {self.acceleration_form!r}")
        self.reward_config()
        if self.use_vllm:
            self._check_vllm()
        self._check_sampling()
        if self.mask_truncated_completions:
            raise SettingError(
                "mask_truncated_completions",
                "reads truncation off a row's last token, but a P-GRPO row is a token trie whose last token ends a "
                "branch; a rollout cut by max_completion_length already gets no correctness reward",
            )
        super().__post_init__()

    def _check_reward_weights(self) -> None:
        """Refuse a reward weight that is not a finite number (how many there must be, and whether a negative
        one makes sense, depends on the reward functions, which the trainer is given)."""
        weights = self.reward_weights
        if weights is not None and not all(is_number(w) and is_finite(w) for w in weights):
            raise SettingError("reward_weights", f"must be finite numbers, not {weights!r}")

    def _check_sampling(self) -> None:
        """Refuse the sampling settings the fork-join rollouts do not apply: they sample with the
        temperature, ``top_p`` and ``top_k`` only, so any other would be silently ignored."""
        for name, unset in UNSAMPLED:
            value = getattr(self, name)
            if value not in unset:
                raise SettingError(
                    name,
                    f"is {value!r}, but PGRPOTrainer's fork-join rollouts sample with temperature, top_p and top_k "
                    f"only and would ignore it: leave it at {unset[0]!r}",
                )

    def _check_vllm(self) -> None:
        if self.vllm_mode != "colocate":
            raise SettingError(
                "vllm_mode",
                f"is {self.vllm_mode!r}, but PGRPOTrainer rolls out on TRL's colocated vLLM "
                "(vllm_mode='colocate'). For a separate vLLM server, pass engine=VLLMServerEngine(url) "
                "(threadweaver.vllm_orchestrator) with use_vllm=False, and keep its weights in sync "
                "yourself: TRL's server protocol takes one set of sampling settings per batch and returns "
                "no finish reasons, and fork-join requests need their own stop tokens and budgets",
            )
        if self.vllm_enable_sleep_mode:
            raise SettingError(
                "vllm_enable_sleep_mode",
                "is on, but PGRPOTrainer's rollouts do not wake and put vLLM back to sleep around generation yet; "
                "leave it off",
            )
        if self.vllm_tensor_parallel_size != 1:
            raise SettingError(
                "vllm_tensor_parallel_size",
                f"is {self.vllm_tensor_parallel_size}, but PGRPOTrainer's rollouts decode each process's prompts on "
                "its own vLLM; tensor parallelism would need every rank of a group to issue the same requests. Use 1",
            )

    def reward_config(self) -> RewardConfig:
        return RewardConfig(
            factor=self.acceleration_factor if self.branching else 0.0,
            clip=self.acceleration_clip,
            form=self.acceleration_form,
        )

    def limits(self) -> Limits:
        """The orchestrator's limits for one rollout: ``max_completion_length`` generated tokens in all."""
        return Limits(
            branching=self.branching,
            max_threads=self.max_threads,
            max_depth=self.max_depth,
            max_tokens=self.max_completion_length,
        )
