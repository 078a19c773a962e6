"""The OpenAI-facing request handling the vLLM endpoint plugin and the proxy share (over a scripted engine).

The routes themselves run on a real vLLM server in integration_tests/test_openai_endpoint.py.
"""

import asyncio
import json
import logging
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
from orchestrator_scripts import GOOD, NESTED, PROMPT

from threadweaver.engine import EngineError, RequestRefused
from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.rows import chat_prompt_ids
from threadweaver.testing import ScriptedEngine
from threadweaver.vllm_orchestrator.openai_api import (
    MESSAGE_LIMIT,
    Admission,
    APIError,
    ServerSettings,
    answer,
    check_model,
    decode,
    parse_request,
    reply,
    stream_reply,
    unprepared,
)


class CharTokenizer:
    """The test format's tokenizer seen through ``plain_ids`` (no chat template)."""

    def __init__(self, fmt):
        self.fmt = fmt

    def encode(self, text, add_special_tokens=False):
        return self.fmt.encode(text)


class Down:
    """An engine whose server is gone."""

    async def generate(self, *args):
        raise EngineError("connection refused")


def test_a_fork_join_completion_is_the_orchestrators_trajectory_in_an_openai_reply(fmt):
    settings = ServerSettings()
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 100, "threadweaver": {"max_threads": 4}}
    assert settings.wants_fork_join(body)
    request = parse_request(body, "completion", CharTokenizer(fmt), settings)
    assert request.prompt_ids == fmt.encode(PROMPT)
    assert request.limits == Limits(max_threads=4, max_tokens=100) and request.sampling.temperature == 0
    trajectory = asyncio.run(decode(request, ScriptedEngine(fmt, GOOD), fmt))
    expected = asyncio.run(Orchestrator(ScriptedEngine(fmt, GOOD), fmt, request.limits).run(fmt.encode(PROMPT)))
    answer = reply("completion", request, trajectory, fmt, "m")
    assert answer["object"] == "text_completion" and answer["model"] == "m"
    assert answer["choices"][0]["text"] == fmt.decode(expected.token_ids[:-1])  # without the final EOS
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == expected.stats.total_tokens
    assert answer["usage"]["prompt_tokens"] == len(fmt.encode(PROMPT))
    stats = answer["threadweaver"]
    assert stats["critical_path_tokens"] == expected.stats.critical_path_tokens < stats["total_tokens"]
    assert len(stats["requests"]) == len(expected.requests) == 4 and stats["degradations"] == []
    assert [r["completion_tokens"] for r in stats["requests"]] == [r.completion_tokens for r in expected.requests]


def test_which_requests_are_fork_join():
    on_request, default = ServerSettings(), ServerSettings(branching_default=True)
    assert not on_request.wants_fork_join({}) and default.wants_fork_join({})
    assert on_request.wants_fork_join({"threadweaver": True}) and on_request.wants_fork_join({"threadweaver": {}})
    assert not default.wants_fork_join({"threadweaver": False})
    with pytest.raises(APIError, match="threadweaver must be true, false or an object of limits, not 'yes'"):
        on_request.wants_fork_join({"threadweaver": "yes"})


def test_the_http_engines_own_requests_are_plain_on_a_server_that_forks_by_default():
    """Their token requests were taken for fork-join ones there, and refused (they ask for 'stop_token_ids')."""
    from threadweaver.vllm_orchestrator import VLLMServerEngine

    default = ServerSettings(branching_default=True)
    engine = VLLMServerEngine("http://127.0.0.1:1")
    for headers in (engine.headers, engine.pinned().headers):
        assert not default.wants_fork_join({}, headers)
        assert default.wants_fork_join({"threadweaver": True}, headers)  # the body's field still says
    assert default.wants_fork_join({}, {"X-Session-ID": "k"})


def test_a_bad_threadweaver_variable_stops_the_server_at_start_naming_it(monkeypatch):
    """vLLM logs what a plugin's constructor raises and serves on without the plugin: fork-join was silently off."""
    from fastapi import FastAPI
    from vllm.plugins.endpoint_plugins.interface import attach_endpoint_plugins

    monkeypatch.setenv("VLLM_PLUGINS", "threadweaver")
    bad = {
        '{"max_thread": 8}': "unknown THREADWEAVER_LIMITS field.* max_thread; known",
        "[1]": "THREADWEAVER_LIMITS must be",
    }
    for value, message in bad.items():
        monkeypatch.setenv("THREADWEAVER_LIMITS", value)
        with pytest.raises(ValueError, match=f"^{message}"):
            attach_endpoint_plugins(FastAPI(), ("generate",))


def test_the_server_settings_travel_to_the_server_process_through_its_environment():
    settings = ServerSettings(True, Limits(max_threads=4, timeout_s=30.0, concurrent_threads=False))
    assert ServerSettings.from_env(settings.env()) == settings
    assert ServerSettings.from_env({}) == ServerSettings()
    with pytest.raises(ValueError, match="THREADWEAVER_LIMITS field.* max_thread; known"):
        ServerSettings.from_env({"THREADWEAVER_LIMITS": '{"max_thread": 4}'})
    with pytest.raises(ValueError, match="THREADWEAVER_LIMITS is not a JSON object"):
        ServerSettings.from_env({"THREADWEAVER_LIMITS": "max_threads=4"})


@pytest.mark.parametrize(
    "body, message",
    [
        ({"threadweaver": {"max_depth": True}}, "threadweaver.max_depth must be a number, not True"),
        ({"threadweaver": {"concurrent_threads": 1}}, "threadweaver.concurrent_threads must be true or false"),
        ({"threadweaver": {"timeout_s": "soon"}}, "threadweaver.timeout_s must be a number"),
        ({"temperature": "hot"}, "'temperature' must be a number"),
        ({"max_tokens": 1.5}, "'max_tokens' must be a number, not 1.5"),
        ({"prompt": ["a", "b"]}, "'prompt' must be one string or one list of token ids"),
        ({"n": 3}, "n must be 1"),
    ],
)
def test_a_request_we_cannot_honour_is_a_400_naming_its_field(fmt, body, message):
    full = {"prompt": PROMPT, "threadweaver": True, **body}
    with pytest.raises(APIError, match=message) as caught:
        parse_request(full, "completion", CharTokenizer(fmt), ServerSettings())
    assert caught.value.status == 400 and caught.value.body()["error"]["code"] == 400


def test_an_engine_that_fails_is_a_500(fmt):
    request = parse_request(
        {"prompt": PROMPT, "threadweaver": True}, "completion", CharTokenizer(fmt), ServerSettings()
    )
    with pytest.raises(APIError, match="the engine failed during fork-join decoding: connection refused") as caught:
        asyncio.run(decode(request, Down(), fmt))
    assert caught.value.status == 500 and caught.value.body()["error"]["type"] == "InternalServerError"


def events(route, request, engine, fmt) -> list:
    async def collect():
        return [event async for event in stream_reply(route, request, engine, fmt, "m")]

    out = []
    for event in asyncio.run(collect()):
        assert event.startswith("data: ") and event.endswith("\n\n")
        data = event[len("data: ") : -2]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.mark.parametrize("route", ["chat", "completion"])
def test_a_streamed_reply_is_the_trajectory_in_order_then_its_totals(fmt, route):
    body = {"prompt": PROMPT, "threadweaver": True, "stream": True, "stream_options": {"include_usage": True}}
    request = parse_request(body, "completion", CharTokenizer(fmt), ServerSettings())  # the route shapes events only
    expected = asyncio.run(decode(request, ScriptedEngine(fmt, NESTED), fmt))
    got = events(route, request, ScriptedEngine(fmt, NESTED), fmt)
    assert got[-1] == "[DONE]"
    *chunks, usage = got[:-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == expected.stats.total_tokens
    assert usage["usage"]["prompt_tokens"] == len(expected.prompt_ids)
    if route == "chat":
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        chunks = chunks[1:]
        pieces = [c["choices"][0]["delta"].get("content", "") for c in chunks]
    else:
        pieces = [c["choices"][0]["text"] for c in chunks]
    assert "".join(pieces) == fmt.decode(expected.token_ids[:-1])
    assert len([p for p in pieces if p]) > 3  # in parts, not one piece at the end
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "stop"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert last["threadweaver"]["critical_path_tokens"] == expected.stats.critical_path_tokens
    assert all("usage" not in c for c in chunks)  # as vLLM's: usage in a chunk of its own
    assert {c["object"] for c in [*chunks, usage]} == {
        "chat.completion.chunk" if route == "chat" else "text_completion"
    }


def test_a_stream_sends_usage_only_when_asked_as_vllm_does(fmt):
    for options in (None, {}, {"include_usage": False}):
        body = {"prompt": PROMPT, "threadweaver": True, "stream": True, "stream_options": options}
        request = parse_request(body, "completion", CharTokenizer(fmt), ServerSettings())
        chunks = events("completion", request, ScriptedEngine(fmt, NESTED), fmt)[:-1]
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and all("usage" not in c for c in chunks)


@pytest.mark.parametrize(
    "body, message",
    [
        ({"stream_options": {"include_usage": True}}, "'stream_options' can only be given with stream: true"),
        ({"stream": True, "stream_options": [True]}, "'stream_options' must be an object, not [True]"),
        ({"stream": True, "stream_options": {"include_usage": "maybe"}}, "include_usage' must be true or false"),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "continuous_usage_stats' is not"),
    ],
)
def test_stream_options_are_checked_as_vllm_checks_them(fmt, body, message):
    with pytest.raises(APIError, match=re.escape(message)):
        parse_request(
            {"prompt": PROMPT, "threadweaver": True, **body}, "completion", CharTokenizer(fmt), ServerSettings()
        )


def test_a_stream_whose_engine_fails_ends_with_an_error_event(fmt):
    request = parse_request(
        {"prompt": PROMPT, "threadweaver": True}, "completion", CharTokenizer(fmt), ServerSettings()
    )
    got = events("completion", request, Down(), fmt)
    assert got[-1] == "[DONE]"
    assert got[-2]["error"]["code"] == 500 and "connection refused" in got[-2]["error"]["message"]


@pytest.mark.parametrize("stop", ["ccc", ["zzz", "d</Thread>"], "d</Thread></Parallel>y"])
def test_a_stop_string_ends_the_text_before_it_streamed_or_not(fmt, stop):
    body = {"prompt": PROMPT, "threadweaver": True, "stop": stop}
    request = parse_request(body, "completion", CharTokenizer(fmt), ServerSettings())
    trajectory = asyncio.run(decode(request, ScriptedEngine(fmt, NESTED), fmt))
    full = fmt.decode(trajectory.token_ids[:-1])
    first = min(full.index(s) for s in ([stop] if isinstance(stop, str) else stop) if s in full)
    answer = reply("completion", request, trajectory, fmt, "m")["choices"][0]
    assert answer["text"] == full[:first] and answer["finish_reason"] == "stop"
    chunks = events("completion", request, ScriptedEngine(fmt, NESTED), fmt)[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == full[:first]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_stop_that_is_not_strings_is_a_400(fmt):
    with pytest.raises(APIError, match="'stop' must be a string or a list of strings, not 3"):
        parse_request({"prompt": PROMPT, "stop": 3}, "completion", CharTokenizer(fmt), ServerSettings())


def test_any_other_failure_is_a_500_that_names_it(fmt):
    class Dead:
        async def generate(self, *args):
            raise RuntimeError("EngineCore died")

    request = parse_request(
        {"prompt": PROMPT, "threadweaver": True}, "completion", CharTokenizer(fmt), ServerSettings()
    )
    with pytest.raises(APIError, match="fork-join decoding failed: RuntimeError: EngineCore died") as caught:
        asyncio.run(decode(request, Dead(), fmt))
    assert caught.value.status == 500
    assert "EngineCore died" in events("chat", request, Dead(), fmt)[-2]["error"]["message"]


class VocabTokenizer(CharTokenizer):
    """The test tokenizer with a vocabulary size, as a Hugging Face tokenizer has."""

    def __len__(self):
        return 300


OPERATOR = ServerSettings(limits=Limits(max_tokens=40, max_threads=4, timeout_s=30.0, concurrent_threads=False))


def request_with(fmt, settings=OPERATOR, **body):
    full = {"prompt": PROMPT, "threadweaver": True, **body}
    return parse_request(full, "completion", VocabTokenizer(fmt), settings)


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"threadweaver": {"max_tokens": 1_000_000_000}},
            "threadweaver.max_tokens: 1000000000 is above this server's ceiling of 40",
        ),
        (
            {"threadweaver": {"max_threads": 1_000_000}},
            "threadweaver.max_threads: 1000000 is above this server's ceiling of 4",
        ),
        (
            {"threadweaver": {"timeout_s": None}},
            "threadweaver.timeout_s: no limit is above this server's ceiling of 30.0",
        ),
        ({"threadweaver": {"timeout_s": 60}}, "threadweaver.timeout_s: 60.0 is above this server's ceiling of 30.0"),
        ({"threadweaver": {"concurrent_threads": True}}, "threadweaver.concurrent_threads: this server has it off"),
        ({"max_tokens": 100_000}, "'max_tokens': 100000 is above this server's ceiling of 40"),
        ({"max_completion_tokens": 41}, "'max_completion_tokens': 41 is above this server's ceiling of 40"),
    ],
)
def test_the_operators_limits_are_ceilings_a_request_cannot_raise(fmt, body, message):
    with pytest.raises(APIError, match=re.escape(message)) as caught:
        request_with(fmt, **body)
    assert caught.value.status == 400


def test_a_request_may_ask_for_less_than_the_ceilings(fmt):
    asked = request_with(fmt, threadweaver={"max_threads": 2, "timeout_s": 5, "branching": False}, max_tokens=10)
    assert asked.limits == replace(OPERATOR.limits, max_threads=2, timeout_s=5.0, branching=False, max_tokens=10)
    assert request_with(fmt).limits == OPERATOR.limits  # nothing asked: the operator's own


@pytest.mark.parametrize(
    "body, message",
    [
        ({"threadweaver": {"max_threads": -5}}, "max_threads must be a whole number of at least 1, not -5"),
        ({"threadweaver": {"max_depth": 0}}, "max_depth must be a whole number of at least 1, not 0"),
        ({"threadweaver": {"timeout_s": -1}}, "timeout_s must be a finite number of seconds, more than 0 (or none)"),
        # JSON's Infinity, which Python's json reads: it once passed as a limit
        ({"threadweaver": {"timeout_s": float("inf")}}, "timeout_s must be a finite number of seconds, more than 0"),
        ({"max_tokens": -1}, "'max_tokens': max_tokens must be a whole number of at least 1, not -1"),
        ({"max_tokens": 0}, "'max_tokens': max_tokens must be a whole number of at least 1, not 0"),
        ({"prompt": [10_000]}, "'prompt' holds token id 10000, outside the vocabulary (0..299)"),
        ({"prompt": [-1, 5]}, "'prompt' holds token id -1"),
        ({"prompt": [True]}, "'prompt' must be one string or one list of token ids"),
        ({"prompt": ""}, "the prompt is empty: there is nothing to continue"),  # a 500 once the core refused it
    ],
)
def test_values_out_of_range_are_a_400_naming_the_field(fmt, body, message):
    with pytest.raises(APIError, match=re.escape(message)) as caught:
        request_with(fmt, ServerSettings(), **body)
    assert caught.value.status == 400


@pytest.mark.parametrize(
    "body, message",
    [
        # vLLM refused these only once the trajectory's first request reached it: a 500, or a stream that
        # began with 200 and ended in a 500 event, where vLLM's own route answers a 400 (bench/serve_load.py)
        ({"temperature": 9}, "'temperature' must be between 0 and 2, not 9.0"),
        ({"temperature": -1}, "'temperature' must be between 0 and 2, not -1.0"),
        ({"top_p": 5}, "'top_p' must be more than 0 and at most 1, not 5.0"),
        ({"top_p": 0}, "'top_p' must be more than 0 and at most 1, not 0.0"),
        ({"top_k": -5}, "'top_k' must be -1 or 0 (every token) or at least 1, not -5"),
        ({"top_k": 1.5}, "'top_k' must be a number, not 1.5"),
        # an integer past float's range was vLLM's bare "int too large to convert to float"
        ({"threadweaver": {"timeout_s": 10**400}}, "threadweaver.timeout_s: the number is too large"),
        ({"temperature": 10**400}, "'temperature': the number is too large"),
        ({"threadweaver": {"max_threads": 10**400}}, "threadweaver.max_threads: 1000"),
    ],
)
def test_sampling_out_of_range_and_numbers_too_large_are_a_400_naming_the_field(fmt, body, message):
    with pytest.raises(APIError, match=re.escape(message)) as caught:
        request_with(fmt, ServerSettings(), **body)
    assert caught.value.status == 400


def test_a_one_token_prompt_is_a_prompt(fmt):
    assert request_with(fmt, ServerSettings(), prompt=[5]).prompt_ids == [5]
    assert request_with(fmt, ServerSettings(), prompt=[[5, 6]]).prompt_ids == [5, 6]


def test_a_prompt_over_the_models_context_is_a_400(fmt):
    short = replace(ServerSettings(), prompt_window=len(fmt.encode(PROMPT)))
    with pytest.raises(
        APIError, match="the prompt is 2 tokens: the server has room to generate after at most 1$"
    ) as caught:
        request_with(fmt, short)
    assert caught.value.status == 400


class Measured:
    """A real tokenizer, recording how many characters each call tokenizes."""

    def __init__(self, tokenizer):
        self.tokenizer, self.lengths = tokenizer, []

    def encode(self, text, add_special_tokens=False):
        self.lengths.append(len(text))
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def __getattr__(self, name):  # its chat template
        return getattr(self.tokenizer, name)


def _asking(route: str, text: str) -> dict:
    if route == "chat":
        return {"messages": [{"role": "user", "content": text}], "threadweaver": True}
    return {"prompt": text, "threadweaver": True}


@pytest.mark.parametrize("route", ["completion", "chat"])
def test_a_prompt_of_megabytes_is_a_400_before_it_is_tokenized_whole(qwen, route):
    """A 60 MB prompt, tokenized whole, ran the proxy out of memory; a 4 MB one held it for 5 s."""
    settings = replace(ServerSettings(), prompt_window=2048)
    measured = Measured(qwen)
    with pytest.raises(
        APIError, match="^the prompt is over 4096 tokens: the server has room to generate after at most 2047$"
    ):
        parse_request(_asking(route, "1+2=3; " * 600_000), route, measured, settings)  # 4.2 MB
    assert max(measured.lengths) <= 1 << 16 and sum(measured.lengths) < 4 * (1 << 16)
    text = "1+2=3; " * 9_400  # 65,800 characters, bytes and tokens: under twice the context, tokenized once
    measured = Measured(qwen)
    with pytest.raises(
        APIError, match=r"^the prompt is 658\d\d tokens: the server has room to generate after at most 39999$"
    ):
        parse_request(_asking(route, text), route, measured, replace(settings, prompt_window=40_000))  # said exactly
    assert len(measured.lengths) == 1
    text = "hello " * 15_000  # 90,000 bytes, 15,000 tokens: counted piece by piece, then tokenized whole
    measured = Measured(qwen)
    ids = parse_request(_asking(route, text), route, measured, replace(settings, prompt_window=40_000)).prompt_ids
    first, second, whole = measured.lengths  # the chat template's text is longer
    assert first == 1 << 16 and first + second == whole >= len(text)
    assert qwen.decode(ids).count("hello ") == 15_000


def test_where_the_servers_context_is_unknown_a_prompt_past_the_most_passed_on_is_a_400(qwen, monkeypatch):
    """A proxy behind SGLang's router knows no context until a refusal says it."""
    from threadweaver.vllm_orchestrator import openai_api

    monkeypatch.setattr(openai_api, "MOST_PROMPT_TOKENS", 50_000)
    measured = Measured(qwen)
    with pytest.raises(
        APIError, match="^the prompt is over 50000 tokens, the most passed on where the context is unknown$"
    ):
        parse_request(_asking("completion", "1+2=3; " * 600_000), "completion", measured, ServerSettings())
    assert max(measured.lengths) <= 1 << 16 and sum(measured.lengths) <= 2 * (1 << 16)  # not 4.2 MB whole
    text = "1+2=3; " * 7_000  # 49,000 tokens: passed on
    assert len(parse_request(_asking("completion", text), "completion", qwen, ServerSettings()).prompt_ids) == 49_000


def test_a_prompt_is_tokenized_beside_the_event_loop(qwen):
    """Tokenized on the event loop, a prompt of a megabyte held every reply streamed meanwhile for a second."""
    ticks = 0

    class Watched(Measured):
        def encode(self, text, add_special_tokens=False):
            before = ticks
            ids = super().encode(text, add_special_tokens)
            self.ticked.append(ticks - before)
            return ids

    watched = Watched(qwen)
    watched.ticked = []
    settings = replace(ServerSettings(), prompt_window=100_000)
    body = {"prompt": "1+2=3; " * 150_000, "threadweaver": True}  # 1 MB, refused after it is counted

    async def main():
        nonlocal ticks
        parsed = asyncio.create_task(answer(body, "completion", watched, settings, None, None, "m"))
        while not parsed.done():
            await asyncio.sleep(0.001)
            ticks += 1
        with pytest.raises(APIError, match="^the prompt is over 200000 tokens"):
            await parsed

    asyncio.run(main())
    assert len(watched.ticked) == 4 and max(watched.ticked) > 0  # the loop ran while the prompt was tokenized


@pytest.mark.parametrize(("route", "name"), [("completion", "'prompt'"), ("chat", "'messages'")])
def test_text_with_a_lone_surrogate_is_a_400(qwen, route, name):
    """The tokenizer's TypeError was a 500 with a traceback on completions (a 400 that named a TypeError on chat)."""
    with pytest.raises(APIError, match=f"^{name} is not Unicode text: it holds the lone surrogate '\\\\ud800'$"):
        parse_request(_asking(route, "a\ud800b"), route, qwen, ServerSettings())


class Template(CharTokenizer):
    chat_template = "{{ messages[0].content }}"

    def apply_chat_template(self, messages, **kwargs):
        raise LookupError("'dict object' has no attribute 'content'")  # what jinja says, in another class


class Rendering(CharTokenizer):
    """A chat template that renders the first turn's content alone."""

    chat_template = "{{ messages[0].content }}"

    def apply_chat_template(self, messages, **kwargs):
        return messages[0]["content"]


def test_messages_the_chat_template_cannot_render_are_a_400(fmt):
    body = {"messages": [{"role": "user"}], "threadweaver": True}
    with pytest.raises(APIError, match="cannot apply the chat template to 'messages': LookupError") as caught:
        parse_request(body, "chat", Template(fmt), ServerSettings())
    assert caught.value.status == 400


class Refusing:
    async def generate(self, *args):
        raise RequestRefused("HTTP 400: this model's maximum context length is 2048 tokens")


def test_a_request_the_engine_refuses_is_a_400(fmt):
    request = request_with(fmt, ServerSettings())
    with pytest.raises(APIError, match="the engine refused a request of the trajectory: HTTP 400") as caught:
        asyncio.run(decode(request, Refusing(), fmt))
    assert caught.value.status == 400


def test_beyond_the_most_trajectories_at_once_a_request_is_a_429(fmt):
    settings, admission = ServerSettings(max_trajectories=1), Admission(1)
    body = {"prompt": PROMPT, "threadweaver": True}
    tokenizer = VocabTokenizer(fmt)

    async def two_at_once():
        slow = ScriptedEngine(fmt, GOOD, 0.05)
        first = asyncio.create_task(answer(body, "completion", tokenizer, settings, slow, fmt, "m", admission))
        await asyncio.sleep(0.01)
        with pytest.raises(APIError, match="at most 1 fork-join trajectories at once") as caught:
            await answer(body, "completion", tokenizer, settings, slow, fmt, "m", admission)
        assert caught.value.status == 429 and caught.value.body()["error"]["type"] == "RateLimitError"
        await first
        assert admission.running == 0  # the reply was sent: the slot is free again
        stream = await answer({**body, "stream": True}, "completion", tokenizer, settings, slow, fmt, "m", admission)
        assert admission.running == 1  # held while the stream is read
        events = [event async for event in stream]
        assert events[-1] == "data: [DONE]\n\n" and admission.running == 0
        unread = await answer({**body, "stream": True}, "completion", tokenizer, settings, slow, fmt, "m", admission)
        await unread.aclose()  # a client gone before the first event
        assert admission.running == 0

    asyncio.run(two_at_once())


def test_the_most_trajectories_at_once_travel_to_the_server_process_too():
    settings = ServerSettings(max_trajectories=3)
    assert ServerSettings.from_env(settings.env()) == settings
    for most in ("many", "0", "-2"):
        with pytest.raises(
            ValueError, match=f"THREADWEAVER_MAX_TRAJECTORIES must be a whole number of at least 1, not '{most}'"
        ):
            ServerSettings.from_env({"THREADWEAVER_MAX_TRAJECTORIES": most})


@pytest.fixture(scope="module")
def with_bos():
    """The embedded model's tokenizer, adding a BOS (its pad token, id 0) as Llama's tokenizer does."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    from threadweaver.quickstart.recipe import embedded_models

    tokenizer = AutoTokenizer.from_pretrained(embedded_models()["parallel"])
    bos = (tokenizer.pad_token, tokenizer.pad_token_id)
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(single=f"{bos[0]} $A", special_tokens=[bos])
    return tokenizer


@pytest.mark.parametrize(
    "route, asked, bos",
    [("completion", None, True), ("completion", False, False), ("chat", None, False), ("chat", "true", True)],
)
def test_add_special_tokens_is_honoured_with_vllms_defaults(with_bos, route, asked, bos):
    body = {"messages": [{"role": "user", "content": "1+2"}], "prompt": "1+2", "threadweaver": True}
    if asked is not None:
        body["add_special_tokens"] = asked
    plain = chat_prompt_ids(with_bos, body["messages"]) if route == "chat" else with_bos.encode("1+2")[1:]
    request = parse_request(body, route, with_bos, ServerSettings())
    assert request.prompt_ids == [with_bos.pad_token_id] * bos + plain


@pytest.mark.parametrize(
    "field, value, taken",
    [
        ("logprobs", "false", True),  # chat: vLLM's schema reads these as false
        ("logprobs", 0.0, True),
        ("logprobs", "yes", False),  # ... and this as true, which fork-join does not honour
        ("add_special_tokens", 1, True),
        ("add_special_tokens", None, False),  # a plain bool in vLLM's schema
        ("add_special_tokens", "maybe", False),
    ],
)
def test_switches_are_read_as_vllms_schemas_read_them(fmt, field, value, taken):
    body = {"messages": [{"role": "user", "content": PROMPT}], "threadweaver": True, field: value}
    if taken:
        assert parse_request(body, "chat", Rendering(fmt), ServerSettings()).prompt_ids
    else:
        with pytest.raises(APIError, match=f"'{field}'"):
            parse_request(body, "chat", Rendering(fmt), ServerSettings())


def test_logprobs_0_asks_for_the_sampled_tokens_on_completions_and_nothing_on_chat_as_in_vllm(fmt):
    body = {"messages": [{"role": "user", "content": "hi"}], "prompt": PROMPT, "threadweaver": True, "logprobs": 0}
    with pytest.raises(APIError, match="do not support 'logprobs'"):
        parse_request(body, "completion", CharTokenizer(fmt), ServerSettings())
    assert parse_request(body, "chat", Rendering(fmt), ServerSettings()).prompt_ids == fmt.encode("hi")


@pytest.mark.parametrize("route", ["chat", "completion"])
@pytest.mark.parametrize(
    "field, value",
    [
        ("logprobs", True),
        ("top_logprobs", 5),
        ("prompt_logprobs", 1),
        ("echo", True),
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "required"),
        ("response_format", {"type": "json_object"}),
        ("structured_outputs", {"regex": "[0-9]+"}),
        ("guided_choice", ["a", "b"]),
        ("logit_bias", {"5": 100}),
        ("presence_penalty", 0.5),
        ("repetition_penalty", 1.2),
        ("min_tokens", 8),
        ("function_call", {"name": "f"}),
        ("chat_template_kwargs", {"enable_thinking": False}),  # Qwen3's: the prompt would change
        ("add_generation_prompt", False),
        ("min_p", 0.1),
        ("ignore_eos", True),
        ("stop_token_ids", [5]),
        ("use_beam_search", True),
        ("include_stop_str_in_output", True),
    ],
)
def test_a_field_fork_join_does_not_honour_is_a_400_naming_it(fmt, route, field, value):
    body = {"messages": [{"role": "user", "content": "hi"}], "prompt": PROMPT, "threadweaver": True, field: value}
    with pytest.raises(APIError) as caught:
        parse_request(body, route, CharTokenizer(fmt), ServerSettings())
    error = caught.value.body()["error"]
    assert error["message"] == (
        f"fork-join requests do not support '{field}' (plain requests, with \"threadweaver\": false, do)"
    )
    assert caught.value.status == 400 and error["code"] == 400 and error["param"] == field


def test_every_field_fork_join_does_not_honour_is_named():
    body = {"prompt": PROMPT, "logprobs": 2, "echo": True}
    with pytest.raises(APIError, match="do not support 'logprobs', 'echo' "):
        parse_request(body, "completion", None, ServerSettings())


def test_those_fields_at_their_defaults_ask_for_nothing(fmt):
    defaults = {
        "logprobs": False,
        "top_logprobs": 0,
        "prompt_logprobs": None,
        "echo": False,
        "tools": None,
        "tool_choice": "auto",
        "response_format": {"type": "text"},
        "structured_outputs": None,
        "logit_bias": {},
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "min_tokens": 0,
    }
    assert request_with(fmt, ServerSettings(), **defaults).prompt_ids == fmt.encode(PROMPT)
    assert request_with(fmt, ServerSettings(), logprobs=None, tool_choice="none").prompt_ids == fmt.encode(PROMPT)


def test_an_error_quotes_a_clients_value_cut_short():
    """vLLM's ``sanitize_message`` takes superlinear time in a message's length, on the event loop: 16 KB of
    echoed input held every client for 20 s."""
    with pytest.raises(APIError) as caught:
        ServerSettings().wants_fork_join({"threadweaver": "/a" * 8000})
    assert str(caught.value) == "threadweaver must be true, false or an object of limits, not '/a/a/a" + "/a" * 36 + "…"
    with pytest.raises(APIError) as caught:
        check_model("m" * 5000, ["a"])
    assert len(str(caught.value)) < 150
    assert len(str(APIError("x" * 5000))) == MESSAGE_LIMIT


def test_n_may_be_null_as_vllm_takes_it(fmt):
    assert request_with(fmt, ServerSettings(), n=None).prompt_ids == fmt.encode(PROMPT)
    with pytest.raises(APIError, match="n must be 1"):
        request_with(fmt, ServerSettings(), n=2)


def test_a_model_the_server_does_not_serve_is_vllms_own_404():
    check_model("b", ["a", "b"])
    check_model(None, ["a"])  # no name: the server's model, as vLLM's own
    with pytest.raises(APIError) as caught:
        check_model("nope", ["a", "b"])
    assert caught.value.status == 404
    assert caught.value.body() == {  # vLLM's ErrorResponse of its _check_model, word for word
        "error": {
            "message": "The model `nope` does not exist. Valid aliases: a, b.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_a_tokenizer_without_the_tags_says_how_to_prepare_the_model():
    from threadweaver.format import missing_tags
    from threadweaver.kit.tokenizers import qwen_tokenizer

    assert missing_tags(qwen_tokenizer()) is None
    missing = missing_tags(qwen_tokenizer(tags=False))
    why = unprepared(missing, "models/qwen3")
    assert why.startswith("the model's tokenizer has no single token for <Parallel>, </Parallel>, <Outlines>")
    assert "`threadweaver prepare models/qwen3 DIR`" in why and "<think>" not in why
    assert "`threadweaver prepare MODEL DIR`" in unprepared(missing)  # for a client: not the server's path


@pytest.fixture(scope="module")
def tagless_dir(tmp_path_factory):
    """Qwen3's tokenizer as Qwen3 ships it (no block tags), saved as a model directory's."""
    from threadweaver.kit.tokenizers import qwen_tokenizer

    path = tmp_path_factory.mktemp("tagless")
    qwen_tokenizer(tags=False).save_pretrained(path)
    return str(path)


def endpoint_on(model_dir, served=None):
    """The endpoint plugin as vLLM's server sets it up for ``model_dir`` (an engine client that never decodes)."""
    from types import SimpleNamespace

    from threadweaver.vllm_orchestrator.endpoint_plugin import ThreadWeaverEndpoint

    endpoint = ThreadWeaverEndpoint()
    client = SimpleNamespace(model_config=SimpleNamespace(max_model_len=2048))
    args = SimpleNamespace(model=model_dir, tokenizer=None, served_model_name=served)
    asyncio.run(endpoint.init_state(client, None, args))
    return endpoint


def test_a_model_without_the_tags_starts_and_refuses_fork_join_saying_how_to_prepare_it(
    tagless_dir, caplog, monkeypatch
):
    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)  # vLLM's logging config stops it
    endpoint = endpoint_on(tagless_dir)  # was: ValueError from Format.from_tokenizer, and no server
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert f"`threadweaver prepare {tagless_dir} DIR`" in warning.getMessage()
    with pytest.raises(APIError) as caught:
        endpoint.check({"model": tagless_dir, "threadweaver": True})
    message = caught.value.body()["error"]["message"]
    assert caught.value.status == 400 and "`threadweaver prepare MODEL DIR`" in message
    assert message.startswith("the model's tokenizer has no single token for <Parallel>")
    with pytest.raises(APIError, match="The model `nope` does not exist") as caught:
        endpoint.check({"model": "nope", "threadweaver": True})  # the name first, as vLLM's routes
    assert caught.value.status == 404


def test_the_endpoint_serves_fork_join_under_its_served_names_only(synth, tmp_path):
    synth.save_pretrained(tmp_path)
    endpoint = endpoint_on(str(tmp_path), served=["tw", "tw-alias"])
    assert endpoint.fmt is not None and endpoint.model == "tw"
    for name in ("tw", "tw-alias", None):
        endpoint.check({"model": name, "threadweaver": True})
    with pytest.raises(APIError, match=re.escape("The model `nope` does not exist. Valid aliases: tw, tw-alias.")):
        endpoint.check({"model": "nope", "threadweaver": True})
    adapters = SimpleNamespace(openai_serving_models=SimpleNamespace(lora_requests={"tw-lora": object()}))
    with pytest.raises(APIError) as caught:
        endpoint.check({"model": "tw-lora", "threadweaver": True}, adapters)
    assert caught.value.status == 400 and caught.value.body()["error"]["message"] == (
        "fork-join decodes the base model only (tw, tw-alias), not the LoRA adapter `tw-lora` "
        '(plain requests, with "threadweaver": false, take it)'
    )


def test_vllms_own_switch_to_skip_the_model_name_check_skips_it_for_fork_join_too(synth, tmp_path, monkeypatch):
    """VLLM_SKIP_MODEL_NAME_VALIDATION: a gateway rewrites the names, and vLLM takes any."""
    synth.save_pretrained(tmp_path)
    endpoint = endpoint_on(str(tmp_path), served=["tw"])
    monkeypatch.setenv("VLLM_SKIP_MODEL_NAME_VALIDATION", "1")
    endpoint.check({"model": "gateway-name", "threadweaver": True})


def test_the_smaller_of_a_requests_two_token_budgets_holds(fmt):
    """The body's max_tokens replaced the request's own threadweaver.max_tokens, even where it was larger."""
    for own, body in ((30, 20), (20, 30)):  # under the operator's ceiling of 40
        assert request_with(fmt, threadweaver={"max_tokens": own}, max_tokens=body).limits.max_tokens == 20


@pytest.mark.parametrize("value, streams", [("false", False), ("no", False), (0, False), ("true", True), (1, True)])
def test_stream_is_read_as_vllm_reads_a_switch(fmt, value, streams):
    """``"stream": "false"`` streamed, where vLLM answers the same body with JSON."""
    assert request_with(fmt, stream=value).stream is streams
    with pytest.raises(APIError, match="'stream' must be true or false, not 'maybe'"):
        request_with(fmt, stream="maybe")


@pytest.mark.parametrize("body", [{"echo": 0}, {"echo": "false"}, {"ignore_eos": 0}, {"use_beam_search": "off"}])
def test_a_switch_left_off_in_vllms_other_spellings_asks_for_nothing(fmt, body):
    request_with(fmt, **body)
    with pytest.raises(APIError, match="do not support"):
        request_with(fmt, **{name: 1 for name in body})


def test_a_huge_number_is_quoted_in_at_most_80_characters(fmt):
    for body in ({"threadweaver": {"max_threads": 10**400}}, {"max_tokens": 10**400}):
        with pytest.raises(APIError) as caught:
            request_with(fmt, **body)
        assert "above this server's ceiling" in str(caught.value) and len(str(caught.value)) < 200
        assert re.search(r"\d+…", str(caught.value)).group(0) == "1" + "0" * 78 + "…"  # 80 characters
