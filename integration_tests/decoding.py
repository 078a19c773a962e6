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
