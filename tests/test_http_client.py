"""The engines' HTTP client keeps one session per event loop and closes the ones it leaves."""

import asyncio

import pytest

from threadweaver.engine import EngineError
from threadweaver.vllm_orchestrator.http import HTTPOptions, JSONClient


def test_a_session_of_another_loop_is_closed_not_dropped():
    client = JSONClient("http://127.0.0.1:9")

    async def session():
        return client._ready()

    first = asyncio.run(session())
    second = asyncio.run(session())
    assert first is not second and first.closed and not second.closed
    asyncio.run(client.aclose())
    assert second.closed


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
