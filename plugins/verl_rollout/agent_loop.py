"""``ThreadWeaverAgentLoop``: fork-join rollouts inside verl's agent loop workers.

verl builds one loop per sample (through hydra, from the registry entry that
:mod:`threadweaver.verl_rollout.plugin` adds) and awaits ``run``. The loop renders the
prompt with verl's own tokenization path, runs the shared orchestrator over verl's
server manager, and returns one ``AgentLoopOutput`` per engine request (see
:mod:`threadweaver.verl_rollout.rows`). A list of outputs per sample needs verl's v1
trainer (``trainer.use_v1=true``); the loop refuses to start without it.

Budgets come from verl's rollout config: ``response_length`` bounds both the tokens one
request generates and the tokens the whole trajectory generates (threads included), so
a trajectory's critical path never exceeds what a sequential rollout could write.
Malformed model output and engine errors never raise: they degrade the trajectory, and
the rows say so in ``extra_fields``.
"""

from __future__ import annotations

import functools
import os
from typing import Any
from uuid import uuid4

from threadweaver.format import Format
from threadweaver.hosts import check_host
from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.verl_rollout.rows import trajectory_rows
from threadweaver.verl_rollout.server_engine import ServerManagerEngine

check_host("verl")

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput  # noqa: E402
from verl.utils.profiler import simple_timer  # noqa: E402

V1_REQUIRED = (
    "the threadweaver agent loop returns one output per engine request (a list per sample), which only "
    "verl's v1 trainer accepts: set trainer.use_v1=true"
)


REWARD_MANAGERS = ("naive", "rate_limited", "remote")
"""verl 0.9.1's registered reward managers that merge a row's ``extra_fields`` (verl's ``tool_extra_fields``)
into the reward's ``extra_info``. ``dapo`` and ``gdpo`` do not: the reward would see neither the trajectory's
text nor its stats, and would pay no acceleration without a word."""


def check_reward_manager(config) -> None:
    """Refuse a registered reward manager that drops the rows' extra fields, or that verl does not have. A
    manager of the user's own (``reward.reward_manager.source=importlib``) is theirs to vouch for."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    manager = config.reward.reward_manager
    if manager.source != "register" or manager.name in REWARD_MANAGERS:
        return
    if manager.name not in REWARD_MANAGER:
        raise ValueError(
            f"reward.reward_manager.name={manager.name}: verl has no reward manager of that name (it has "
            f"{', '.join(sorted(REWARD_MANAGER))}); use one that passes the threadweaver rows' extra fields to the "
            f"reward: {', '.join(REWARD_MANAGERS)}"
        )
    raise ValueError(
        f"reward.reward_manager.name={manager.name}: verl's {manager.name} reward manager does not pass the "
        "threadweaver rows' extra fields (the trajectory's text and stats) to the reward, which would then pay no "
        f"acceleration and log no trajectory stats; use one that does: {', '.join(REWARD_MANAGERS)}"
    )


def check_reward_kwargs(config) -> None:
    """Refuse, as the loop is built, ``reward_kwargs`` that threadweaver's reward would refuse only at its first
    call, after the first batch of rollouts. Another reward function's kwargs are its own."""
    from threadweaver.verl_rollout import reward

    function = config.reward.get("custom_reward_function") or {}
    path = str(function.get("path") or "")
    ours = path == "pkg://" + reward.__name__ or (os.path.isfile(path) and os.path.samefile(path, reward.__file__))
    if ours:
        reward.reward_config(dict(function.get("reward_kwargs") or {}))


@functools.lru_cache(maxsize=8)
def _format(tokenizer) -> Format:
    return Format.from_tokenizer(tokenizer)


class ThreadWeaverAgentLoop(AgentLoopBase):
    def __init__(
        self,
        *args,
        branching: bool = Limits.branching,
        max_threads: int = Limits.max_threads,
        max_depth: int = Limits.max_depth,
        timeout_s: float | None = Limits.timeout_s,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if not self.config.trainer.get("use_v1", False):
            raise ValueError(V1_REQUIRED)
        check_reward_manager(self.config)
        check_reward_kwargs(self.config)
        response_length = self.rollout_config.response_length
        self.limits = Limits(
            branching=branching,
            max_threads=max_threads,
            max_depth=max_depth,
            max_tokens=response_length,
            timeout_s=timeout_s,
        )
        self.fmt = _format(self.tokenizer)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> list[AgentLoopOutput]:
        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        engine = ServerManagerEngine(self.server_manager, uuid4().hex, sampling_params)
        orchestrator = Orchestrator(engine, self.fmt, self.limits, degrade_on_engine_error=True, keep_calls=True)
        timing: dict[str, float] = {}
        with simple_timer("generate_sequences", timing):
            trajectory = await orchestrator.run(prompt_ids)
        metrics = AgentLoopMetrics(generate_sequences=timing["generate_sequences"])
        return [
            AgentLoopOutput(
                prompt_ids=row.prompt_ids,
                response_ids=row.response_ids,
                response_mask=row.response_mask,
                response_logprobs=row.response_logprobs,
                num_turns=2,
                metrics=metrics,
                extra_fields=dict(row.extra_fields, turn_scores=[], tool_rewards=[]),
            )
            for row in trajectory_rows(trajectory, self.fmt)
        ]


class SequentialAgentLoop(ThreadWeaverAgentLoop):
    """The paper's sequential baseline: the same loop, rows and reward with branching off."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "branching": False})
