"""Registers the agent loops with verl; the ``verl.plugins`` entry point imports this module.

``threadweaver``: fork-join rollouts. ``threadweaver_sequential``: the paper's baseline,
the same loop with branching off (one plain request per trajectory, same rows and reward).
Safe to import more than once and in every process.
"""

from __future__ import annotations

AGENT_LOOP = "threadweaver.verl_rollout.agent_loop.ThreadWeaverAgentLoop"
AGENT_LOOPS = {
    "threadweaver": {"_target_": AGENT_LOOP},
    "threadweaver_sequential": {"_target_": AGENT_LOOP, "branching": False},
}


def register() -> None:
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    for name, config in AGENT_LOOPS.items():
        _agent_loop_registry.setdefault(name, dict(config))


register()
