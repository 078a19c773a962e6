"""Several servers without a router (``--base-url "URL1 URL2"``): one server per trajectory, spread by load."""

import asyncio

import pytest
from orchestrator_scripts import GOOD, NESTED

from threadweaver.orchestrator import Orchestrator
from threadweaver.testing import ScriptedEngine, StreamingScriptedEngine
from threadweaver.vllm_orchestrator.engines import EngineArgs, make_engine
from threadweaver.vllm_orchestrator.replicas import Replicas
from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine


def prompts(fmt, count):
    return [fmt.encode(f"{i}Q?") for i in range(count)]  # each its own prompt; every script key still matches


def test_each_trajectory_stays_on_one_server_and_trajectories_spread(fmt):
    servers = [ScriptedEngine(fmt, NESTED, delay=0.01) for _ in range(3)]
    replicas = Replicas(servers)

    async def all_of_them():
        orchestrator = Orchestrator(replicas, fmt)
        return await asyncio.gather(*(orchestrator.run(p) for p in prompts(fmt, 9)))

    trajectories = asyncio.run(all_of_them())
    assert len({t.token_ids for t in trajectories}) == 1  # the same decoding wherever it ran
    served = [{tuple(c[:3]) for c in s.calls} for s in servers]  # the prompts each server saw
    assert [len(s) for s in served] == [3, 3, 3]  # nine trajectories at once: three each
    assert sum(len(s.calls) for s in servers) == sum(len(t.requests) for t in trajectories)
    assert replicas.in_flight == [0, 0, 0]


def test_a_new_trajectory_goes_where_fewest_requests_are_in_flight(fmt):
    servers = [ScriptedEngine(fmt, GOOD) for _ in range(2)]
    replicas = Replicas(servers)
    replicas.in_flight[:] = [5, 1]
    assert replicas.pinned().engine is servers[1]
    replicas.in_flight[:] = [0, 0]
    assert [replicas.pinned().index for _ in range(3)] == [0, 1, 0]  # ties in turn


def test_streaming_servers_stream_through_the_pin(fmt):
    replicas = Replicas([StreamingScriptedEngine(fmt, GOOD) for _ in range(2)])
    runs = []
    t = asyncio.run(Orchestrator(replicas, fmt).run(prompts(fmt, 1)[0], on_tokens=runs.append))
    assert hasattr(replicas.pinned(), "stream") and not hasattr(
        Replicas([ScriptedEngine(fmt, GOOD)]).pinned(), "stream"
    )
    assert [i for run in runs for i in run] == list(t.token_ids) and len(runs) > len(t.requests)


def test_base_url_takes_several_servers():
    one = make_engine(EngineArgs(base_url="http://127.0.0.1:8001"))
    two = make_engine(EngineArgs(base_url="http://127.0.0.1:8001  http://127.0.0.1:8002"))
    assert isinstance(one, VLLMServerEngine)
    assert isinstance(two, Replicas) and [e.client.base_url for e in two.engines] == [
        "http://127.0.0.1:8001",
        "http://127.0.0.1:8002",
    ]


def test_behind_a_router_each_trajectory_sends_one_session_key(fmt):
    """The orchestrator pins a trajectory to a session key (``http.SessionKeyed``): every request
    it sends carries the key in the headers routers hash on, and each trajectory has its own."""
    import json

    from orchestrator_scripts import GOOD

    from threadweaver.testing import ScriptedEngine

    script = ScriptedEngine(fmt, GOOD)
    seen = []  # (method, path, headers) of each request

    async def vllm(reader, writer):
        method, path, _ = (await reader.readline()).decode().split(" ")
        headers = {}
        while (line := (await reader.readline()).decode().strip()) != "":
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        body = json.loads(await reader.readexactly(int(headers.get("content-length", 0)))) if method == "POST" else {}
        seen.append((method, path, headers))
        if method == "GET":
            reply = {"data": [{"id": "kit", "max_model_len": 4096}]}
        else:
            c = await script.generate(body["prompt"], body["stop_token_ids"], body["max_tokens"], None)
            reply = {"choices": [{"token_ids": list(c.token_ids), "finish_reason": c.finish_reason}]}
        data = json.dumps(reply).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
        await writer.drain()
        writer.close()

    async def two_trajectories():
        server = await asyncio.start_server(vllm, "127.0.0.1", 0)
        engine = VLLMServerEngine(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            orchestrator = Orchestrator(engine, fmt)
            return [await orchestrator.run(p) for p in prompts(fmt, 2)]
        finally:
            await engine.aclose()
            server.close()

    trajectories = asyncio.run(two_trajectories())
    assert [m for m, _, _ in seen].count("GET") == 1  # the pinned views share the model card
    posts = [h for m, _, h in seen if m == "POST"]
    assert len(posts) == sum(len(t.requests) for t in trajectories) > 2
    keys = {h["x-session-id"] for h in posts}
    assert len(keys) == 2 and all(h["x-smg-routing-key"] == h["x-session-id"] for h in posts)


def test_the_prompt_window_is_the_narrowest_any_server_says(fmt):
    class Windowed(ScriptedEngine):
        def __init__(self, window):
            super().__init__(fmt, GOOD)
            self.window = window

        async def prompt_window(self):
            if self.window == "down":
                raise ConnectionError("cannot reach it")
            return self.window

    assert asyncio.run(Replicas([Windowed(4096), Windowed(None), Windowed(2048)]).prompt_window()) == 2048
    assert asyncio.run(Replicas([ScriptedEngine(fmt, GOOD)]).prompt_window()) is None  # no server says
    with pytest.raises(ConnectionError):  # every server is asked: one down is an error before any trajectory
        asyncio.run(Replicas([Windowed(4096), Windowed("down")]).prompt_window())
