"""The engines' HTTP client keeps one session per event loop and closes the ones it leaves."""

import asyncio

from threadweaver.vllm_orchestrator.http import JSONClient


def test_a_session_of_another_loop_is_closed_not_dropped():
    client = JSONClient("http://127.0.0.1:9")

    async def session():
        return client._ready()

    first = asyncio.run(session())
    second = asyncio.run(session())
    assert first is not second and first.closed and not second.closed
    asyncio.run(client.aclose())
    assert second.closed
