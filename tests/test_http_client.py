"""The engines' HTTP client keeps one session per event loop and closes the ones it leaves."""

import asyncio
import json
import re
import time

import pytest

from threadweaver.cli_args import SettingError
from threadweaver.engine import EngineError
from threadweaver.vllm_orchestrator.http import HTTPOptions, JSONClient


@pytest.mark.parametrize(
    "options, message",
    [
        ({"timeout_s": 0}, "timeout_s must be a finite number of seconds, more than 0, not 0"),
        ({"timeout_s": float("inf")}, "timeout_s must be a finite number of seconds, more than 0, not inf"),
        ({"backoff_s": -1}, "backoff_s must be a finite number of at least 0, not -1"),
    ],
)
def test_options_that_no_request_could_keep_are_refused_naming_the_field(options, message):
    with pytest.raises(SettingError, match=re.escape(message)):
        HTTPOptions(**options)


def test_a_session_of_another_loop_is_closed_not_dropped():
    client = JSONClient("http://127.0.0.1:9")

    async def session():
        return client._ready()

    kept = asyncio.new_event_loop()  # a loop that stays open (run_sync keeps one per thread)
    try:
        first = kept.run_until_complete(session())
        connector = first.connector
        second = asyncio.run(session())  # its own loop, closed after: nothing can run there
        assert first is not second and not second.closed
        kept.run_until_complete(asyncio.sleep(0.01))  # the kept loop runs again, and closes its session
        assert first.closed and connector.closed
        third = asyncio.run(session())
        assert third is not second and second.closed  # let go: its loop is closed
    finally:
        kept.close()
    asyncio.run(client.aclose())
    assert third.closed


def test_a_server_that_dies_mid_answer_is_retried_then_a_clear_error():
    """A body cut short (the server killed while it answers) is a connection failure, not a crash."""

    async def scenario():
        answered = []

        async def half_an_answer(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            answered.append(1)
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a":')
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(half_an_answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = JSONClient(f"http://127.0.0.1:{port}", HTTPOptions(retries=2, backoff_s=0.01))
        try:
            with pytest.raises(EngineError, match=r"cannot reach the server .*ClientPayloadError.* after 3 tries"):
                await client.post("/v1/completions", {})
        finally:
            await client.aclose()
            server.close()
        return len(answered)

    assert asyncio.run(scenario()) == 3


def served(answers: list[bytes]):
    """A loopback server that gives each request the next of ``answers`` (raw HTTP), then closes."""
    asked = []

    async def answer(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        asked.append(1)
        writer.write(answers[min(len(asked), len(answers)) - 1])
        await writer.drain()
        writer.close()

    return asked, answer


def stream_of(*events: bytes) -> bytes:
    body = b"".join(b"data: " + e + b"\n\n" for e in events)
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def json_reply(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


BUSY = b"HTTP/1.1 503 Busy\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def events_of(answers: list[bytes]) -> tuple[list, int]:
    async def scenario():
        asked, answer = served(answers)
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = JSONClient(f"http://127.0.0.1:{port}", HTTPOptions(retries=2, backoff_s=0.01))
        got = []
        try:
            async for event in client.events("/v1/completions", {}):
                got.append(event)
        except EngineError as err:
            got.append(str(err))
        finally:
            await client.aclose()
            server.close()
        return got, len(asked)

    return asyncio.run(scenario())


def test_a_stream_is_retried_until_its_first_event_then_read_to_done():
    got, asked = events_of([BUSY, stream_of(b'{"n": 1}', b'{"n": 2}', b"[DONE]")])
    assert got == [{"n": 1}, {"n": 2}] and asked == 2


def test_a_stream_broken_off_after_its_first_event_is_an_error_not_a_retry():
    got, asked = events_of([stream_of(b'{"n": 1}')])  # no [DONE]: the server went away
    assert got[0] == {"n": 1} and asked == 1
    assert "broke off its stream" in got[1] and "the stream ended before [DONE]" in got[1]


def test_a_stream_refused_with_a_4xx_says_why_at_once():
    refused = b"HTTP/1.1 400 Bad\r\nContent-Length: 30\r\n\r\n" + b'{"error": {"message": "nope"}}'
    got, asked = events_of([refused])
    assert len(got) == 1 and got[0].endswith("answered POST /v1/completions with HTTP 400: nope") and asked == 1


def test_a_request_the_server_aborts_names_the_server_and_why():
    """vLLM answers 200 with finish_reason 'abort' for what was running when it shuts down."""
    from threadweaver.engine import Sampling
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    models = json_reply(b'{"data": [{"id": "m", "max_model_len": 64}]}')
    aborted = json_reply(b'{"choices": [{"token_ids": [5], "finish_reason": "abort", "stop_reason": null}]}')

    async def scenario():
        _, answer = served([models, aborted])
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        engine = VLLMServerEngine(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            await engine.generate([1, 2], [0], 8, Sampling())
        finally:
            await engine.aclose()
            server.close()

    aborted_by = r"^vLLM server at http://127\.0\.0\.1:\d+ aborted the request: it is shutting down"
    with pytest.raises(EngineError, match=aborted_by):
        asyncio.run(scenario())


def test_aliases_and_lora_adapters_leave_one_model_to_decode():
    """vLLM lists each ``--served-model-name`` alias as a card of the same root, and each LoRA adapter as a card
    with a ``parent``: the engine decodes the one base model, and knows which names are which."""
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    cards = [
        {"id": "tw", "root": "/m", "max_model_len": 64},
        {"id": "tw-alias", "root": "/m", "max_model_len": 64},
        {"id": "tw-lora", "root": "/lora", "parent": "tw"},
    ]
    models = json_reply(json.dumps({"data": cards}).encode())

    async def scenario():
        _, answer = served([models])
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        engine = VLLMServerEngine(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            return await engine.model_root(), await engine.served_models()
        finally:
            await engine.aclose()
            server.close()

    assert asyncio.run(scenario()) == ("/m", (["tw", "tw-alias"], ["tw-lora"]))


def test_a_url_given_as_an_openai_client_takes_it_reaches_the_same_paths():
    """``http://host:port/v1`` (an OpenAI client's base URL) is the server's root plus /v1: the paths are
    not doubled (``/v1/v1/models`` was a 404 that named the right path)."""

    async def scenario():
        asked = []

        async def answer(reader, writer):
            asked.append((await reader.readuntil(b"\r\n\r\n")).split(b" ")[1].decode())
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        for url in (f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{port}/v1/", f"http://127.0.0.1:{port}"):
            client = JSONClient(url)
            assert await client.get("/v1/models") == {}
            await client.aclose()
        server.close()
        return asked

    assert asyncio.run(scenario()) == ["/v1/models"] * 3


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "localhost", "ws://127.0.0.1:8000"])
def test_a_url_without_an_http_scheme_is_refused_when_the_engine_is_made(url):
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    with pytest.raises(ValueError, match=f"the vLLM server's URL must be an http:// or https:// URL, not '{url}'"):
        VLLMServerEngine(url)


@pytest.mark.parametrize(
    "url, said",
    [
        ("http://127.0.0.1:8000,http://127.0.0.1:8001", "must be one server's address (http://host:port), not"),
        ("http://:8000", "must name a server's host (http://host:port), not"),
    ],
)
def test_two_urls_joined_by_a_comma_or_no_host_are_refused_when_the_engine_is_made(url, said):
    """aiohttp's own error was the bare URL and a path (InvalidURL), at the first request."""
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    with pytest.raises(ValueError, match=f"^the vLLM server's URL {re.escape(said)} '{re.escape(url)}'"):
        VLLMServerEngine(url)


def test_the_server_root_drops_only_a_last_v1_of_the_path():
    from threadweaver.vllm_orchestrator.http import server_root

    cases = {
        "http://h:8000/v1/": "http://h:8000",
        "http://gateway/api/v1": "http://gateway/api",
        "http://v1": "http://v1",  # a host named v1
        "https://h/v1x": "https://h/v1x",
        "http://h:8000/v1/completions": "http://h:8000",  # as lm-eval's own models take a server
        "http://h/api/v1/chat/completions/": "http://h/api",
    }
    assert {url: server_root(url) for url in cases} == cases
    for url in ("http://h/v1?key=1", "http://h:8000/#v1"):  # paths would be appended after them
        with pytest.raises(ValueError, match="must be a server's address, without a query or fragment"):
            server_root(url)


def test_a_server_that_answers_nothing_is_reported_once_and_its_return_too(monkeypatch, caplog):
    """A paused server (SIGSTOP) accepts connections and answers nothing: the client waits, as for a long
    decode, but says so once its /health goes unanswered, and says when the server answers again."""
    from threadweaver.vllm_orchestrator import http

    monkeypatch.setattr(http, "QUIET_S", 0.3)
    monkeypatch.setattr(http, "PROBE_S", 0.2)
    paused = asyncio.Event()
    paused.set()

    async def answer(reader, writer):
        path = (await reader.readuntil(b"\r\n\r\n")).split(b" ")[1]
        while paused.is_set():
            await asyncio.sleep(0.05)
        writer.write(json_reply(b"{}" if path == b"/health" else b'{"done": true}'))
        await writer.drain()
        writer.close()

    async def scenario():
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        client = JSONClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", what="vLLM server")
        try:
            request = asyncio.ensure_future(client.post("/v1/completions", {}))
            await asyncio.sleep(1.5)  # several probes unanswered
            paused.clear()
            assert await request == {"done": True}
            await client.post("/v1/completions", {})  # answered at once: nothing more to say
        finally:
            await client.aclose()
            server.close()

    with caplog.at_level("WARNING", logger=http.__name__):
        asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "not answer GET /health within 0.2s, while POST /v1/completions has waited" in said[0]
    assert "is it paused or stuck? Still waiting, up to 3600s a request" in said[0]
    assert said[1].startswith("the vLLM server at http://127.0.0.1:") and said[1].endswith(" answers again")


def test_a_stream_whose_server_pauses_between_events_is_reported_once_and_its_return_too(monkeypatch, caplog):
    """A stream waits for each event as for a whole reply: a server paused after the first event is said once,
    and so is its return; the stream is read to the end."""
    from threadweaver.vllm_orchestrator import http

    monkeypatch.setattr(http, "QUIET_S", 0.3)
    monkeypatch.setattr(http, "PROBE_S", 0.2)
    paused = asyncio.Event()

    async def answer(reader, writer):
        path = (await reader.readuntil(b"\r\n\r\n")).split(b" ")[1]
        if path == b"/health":
            while paused.is_set():
                await asyncio.sleep(0.05)
            writer.write(json_reply(b"{}"))
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + b'data: {"n": 1}\n\n')
            await writer.drain()
            paused.set()
            await asyncio.sleep(1.5)  # several probes unanswered
            paused.clear()
            writer.write(b'data: {"n": 2}\n\ndata: [DONE]\n\n')
        await writer.drain()
        writer.close()

    async def scenario():
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        client = JSONClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", what="vLLM server")
        try:
            return [event async for event in client.events("/v1/completions", {})]
        finally:
            await client.aclose()
            server.close()

    with caplog.at_level("WARNING", logger=http.__name__):
        assert asyncio.run(scenario()) == [{"n": 1}, {"n": 2}]
    said = [r.getMessage() for r in caplog.records if r.name == http.__name__]  # not the stand-in's closed probes
    assert len(said) == 2, said
    assert "not answer GET /health within 0.2s, while the stream of POST /v1/completions has waited" in said[0]
    assert said[1].endswith(" answers again")


def test_a_long_decode_whose_server_answers_its_health_is_not_reported(monkeypatch, caplog):
    from threadweaver.vllm_orchestrator import http

    monkeypatch.setattr(http, "QUIET_S", 0.2)
    probes = []

    async def answer(reader, writer):
        path = (await reader.readuntil(b"\r\n\r\n")).split(b" ")[1]
        if path == b"/health":
            probes.append(1)
        else:
            await asyncio.sleep(1.0)  # decoding
        writer.write(json_reply(b"{}"))
        await writer.drain()
        writer.close()

    async def scenario():
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        client = JSONClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        started = time.monotonic()
        try:
            await asyncio.gather(*(client.post("/v1/completions", {}) for _ in range(8)))
        finally:
            await client.aclose()
            server.close()
        return time.monotonic() - started

    with caplog.at_level("WARNING", logger=http.__name__):
        waited = asyncio.run(scenario())
    assert not caplog.records and 1 <= len(probes) <= waited / 0.2 + 1  # one a QUIET_S for all eight requests


def test_a_server_that_never_answers_is_not_said_to_answer_again(monkeypatch, caplog):
    """The request times out: the server stays silent, and only its silence is said."""
    from threadweaver.vllm_orchestrator import http

    monkeypatch.setattr(http, "QUIET_S", 0.3)
    monkeypatch.setattr(http, "PROBE_S", 0.2)

    async def answer(reader, writer):
        await asyncio.sleep(30)

    async def scenario():
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        client = JSONClient(url, HTTPOptions(timeout_s=1.0, retries=0), what="vLLM server")
        try:
            with pytest.raises(EngineError, match="cannot reach the vLLM server"):
                await client.post("/v1/completions", {})
        finally:
            await client.aclose()
            server.close()

    with caplog.at_level("WARNING", logger=http.__name__):
        asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records if r.name == http.__name__]  # not the stand-in's cancelled tasks
    assert len(said) == 1 and " does not answer GET /health " in said[0]


def test_an_html_error_page_is_said_as_its_text_on_one_line():
    """A URL that reaches some other web server (a dev server, a proxy's error page) gets its page's words."""
    page = b"<!DOCTYPE HTML>\n<html><body>\n<h1>Error response</h1>\n<p>Message: File not found.</p>\n</body></html>\n"
    refused = b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page)
    got, _ = events_of([refused])
    assert len(got) == 1 and got[0].endswith(" with HTTP 404: Error response Message: File not found.")


def test_a_page_that_is_not_json_where_a_reply_was_meant_says_whose_it_is():
    """A 200 web page (another app on that port) was a JSONDecodeError: 'Expecting value: line 1 column 1'."""
    page = b"<html><body><h1>Welcome to nginx!</h1></body></html>"
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page)

    async def scenario():
        asked, answer = served([ok])
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        client = JSONClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", what="vLLM server")
        try:
            with pytest.raises(EngineError) as refused:
                await client.get("/v1/models")
        finally:
            await client.aclose()
            server.close()
        return str(refused.value), len(asked)

    said, asked = asyncio.run(scenario())
    assert asked == 1 and said.endswith(
        "answered GET /v1/models with what is not JSON: 'Welcome to nginx!'; is it the server's address?"
    )
