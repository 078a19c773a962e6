"""threadweaver.verl_rollout: ThreadWeaver rollouts in unmodified verl (0.9.1, v1 trainer).

``pip install threadweaver[verl]`` registers the agent loops ``threadweaver`` (fork-join)
and ``threadweaver_sequential`` (the baseline) through the ``verl.plugins`` entry point;
select one with ``actor_rollout_ref.rollout.agent.default_agent_loop=threadweaver`` or a
dataset's ``agent_name`` column. The reward is
``reward.custom_reward_function.path=pkg://threadweaver.verl_rollout.reward``. See
``examples/verl/`` for complete P-GRPO and baseline launches.
"""

PARALLEL_LOOP = "threadweaver"
SEQUENTIAL_LOOP = "threadweaver_sequential"
AGENT_LOOPS = (PARALLEL_LOOP, SEQUENTIAL_LOOP)
"""The agent loop names :mod:`threadweaver.verl_rollout.plugin` registers (here, where no verl import is needed)."""
