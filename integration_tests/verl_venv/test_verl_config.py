"""The shipped verl configs, composed by hydra over verl 0.9.1's own ppo_trainer.yaml and
checked by verl's own ``validate_config`` and config dataclasses, as ``main_ppo`` does."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict

import pytest
from hydra import compose, initialize_config_dir
from verl.trainer.main_ppo import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config
from wheel_venv import wheel_venv

from threadweaver.reward import RewardConfig
from threadweaver.verl_rollout.config import CONFIG_DIR

pytestmark = pytest.mark.slow


def composed(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=name, overrides=["actor_rollout_ref.model.path=/models/sft", *overrides])


@pytest.mark.parametrize(
    "name, agent", [("threadweaver_pgrpo", "threadweaver"), ("threadweaver_sequential", "threadweaver_sequential")]
)
def test_the_configs_are_valid_verl_configs_with_the_papers_settings(name, agent):
    config = composed(name)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert config.trainer.use_v1 and config.algorithm.adv_estimator == "grpo"
    assert config.algorithm.norm_adv_by_std_in_grpo is False
    assert not need_reference_policy(config) and not need_critic(config)
    assert (actor.optim.lr, actor.clip_ratio_low, actor.clip_ratio_high) == (1e-6, 0.2, 0.28)
    assert rollout.n == 8 and rollout.temperature == 1.0 and rollout.calculate_log_probs
    assert rollout.agent.default_agent_loop == agent
    assert rollout.max_model_len >= config.data.max_prompt_length + rollout.response_length
    assert actor.ppo_max_token_len_per_gpu >= rollout.max_model_len
    assert config.reward.custom_reward_function.path == "pkg://threadweaver.verl_rollout.reward"


def test_the_reward_knobs_are_declared_with_reward_configs_defaults():
    """Every knob overridable without ``+``, with the values the reward uses when it is not given."""
    config = composed("threadweaver_pgrpo", "reward.custom_reward_function.reward_kwargs.form=ratio")
    assert dict(composed("threadweaver_pgrpo").reward.custom_reward_function.reward_kwargs) == asdict(RewardConfig())
    assert config.reward.custom_reward_function.reward_kwargs.form == "ratio"


def test_the_rollouts_context_follows_the_prompt_and_response_lengths():
    config = composed("threadweaver_sequential", "data.max_prompt_length=1000", "data.max_response_length=2000")
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert rollout.max_model_len == rollout.max_num_batched_tokens == 1000 + 2000 + 1024
    assert config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == rollout.max_model_len
    assert composed("threadweaver_pgrpo").actor_rollout_ref.rollout.max_model_len == 18432


def test_command_line_overrides_still_apply():
    config = composed("threadweaver_pgrpo", "trainer.n_gpus_per_node=4", "actor_rollout_ref.rollout.n=16")
    assert config.trainer.n_gpus_per_node == 4 and config.actor_rollout_ref.rollout.n == 16


def test_a_wheel_install_carries_the_entry_point_and_the_configs(tmp_path):
    """What ``pip install threadweaver[verl]`` gives a user (see wheel_venv)."""
    python, site = wheel_venv(tmp_path)
    code = (
        "import json, os, verl, threadweaver\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as r\n"
        "from threadweaver.verl_rollout.config import CONFIG_DIR\n"
        "print(json.dumps([threadweaver.__file__, r['threadweaver']['_target_'], sorted(os.listdir(CONFIG_DIR))]))"
    )
    where, target, configs = json.loads(
        subprocess.run(
            [python, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path
        ).stdout.splitlines()[-1]
    )
    assert where.startswith(str(site))
    assert target == "threadweaver.verl_rollout.agent_loop.ThreadWeaverAgentLoop"
    assert configs == ["_threadweaver_settings.yaml", "threadweaver_pgrpo.yaml", "threadweaver_sequential.yaml"]
