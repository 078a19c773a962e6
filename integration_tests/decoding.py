"""Decoding helpers the engine integration tests share (vLLM on loopback, SGLang's wire)."""

import asyncio
import json

from threadweaver.orchestrator import Limits, Orchestrator, Sampling
from threadweaver.rows import RowReader


def prompts(root, tokenizer, count=8):
    rows = [json.loads(line) for line in (root / "data" / "parallel" / "validation.jsonl").read_text().splitlines()]
    return [RowReader(tokenizer).prompt(row) for row in rows[:count]]


def decode(engine, fmt, prompt_list, limits=Limits()):
    async def run_all():
        try:
            return await asyncio.gather(*[Orchestrator(engine, fmt, limits).run(p) for p in prompt_list])
        finally:
            await engine.aclose()

    return asyncio.run(run_all())


def generate_once(engine, prompt_ids, stop_ids, max_tokens):
    """One greedy request through ``engine``, closing its connections afterwards."""

    async def one():
        try:
            return await engine.generate(prompt_ids, stop_ids, max_tokens, Sampling())
        finally:
            await engine.aclose()

    return asyncio.run(one())


def prefix_hits(t) -> list[tuple[int, int]]:
    """(cached tokens, the full KV blocks that an earlier request of ``t`` computed for it) for the
    first block's threads and for the request after its join.

    Each thread's context starts with the head request's context and completion; the request after
    the join starts with thread 1's whole sequence (prompt, head, seed, body, ``</Thread>``). On the
    server that ran those earlier requests every full KV block of them must come from the prefix
    cache (``threadweaver serve`` uses 32-token blocks on CPU).
    """
    head = t.requests[0]
    threads = [r for r in t.requests if len(r.thread_path) == 1 and r.thread_path[0][0] == 0]
    thread_one = next(r for r in threads if r.thread_path == ((0, 1),))
    join = [r for r in t.requests if r.thread_path == ()][1]
    earlier = [(r, head) for r in threads] + [(join, thread_one)]
    return [(r.cached_tokens, 32 * ((e.context_tokens + e.completion_tokens) // 32)) for r, e in earlier]
