"""Registers the agent loops with verl; the ``verl.plugins`` entry point imports this module.

``threadweaver``: fork-join rollouts. ``threadweaver_sequential``: the paper's baseline,
the same loop with branching off (one plain request per trajectory, same rows and reward).
Registering is this module's import: verl 0.9.1 (``verl/__init__.py``) imports every
module of the ``verl.plugins`` entry-point group and calls nothing in it, so importing is
the one seam it offers. Safe to import more than once and in every process. A verl outside the supported range
leaves ``import verl`` working and says why the loops are missing.
"""

from __future__ import annotations

import warnings

from threadweaver.hosts import UnsupportedHostError, check_host


def register() -> None:
    try:
        check_host("verl")
    except UnsupportedHostError as err:
        warnings.warn(f"{err}; the threadweaver agent loops are not registered", RuntimeWarning, stacklevel=2)
        return
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import register as register_agent_loop

    from threadweaver.pgrpo import PAPER
    from threadweaver.verl_rollout import PARALLEL_LOOP, SEQUENTIAL_LOOP
    from threadweaver.verl_rollout.agent_loop import SequentialAgentLoop, ThreadWeaverAgentLoop

    register_agent_loop(PARALLEL_LOOP)(ThreadWeaverAgentLoop)
    register_agent_loop(SEQUENTIAL_LOOP)(SequentialAgentLoop)
    # ${threadweaver:learning_rate} and the like in our configs: the paper's settings, declared once.
    OmegaConf.register_new_resolver("threadweaver", lambda name: getattr(PAPER, name), replace=True)
    # ${threadweaver_sum:A,B,...}: a length that follows others (rollout.max_model_len).
    OmegaConf.register_new_resolver("threadweaver_sum", lambda *terms: sum(terms), replace=True)


register()
