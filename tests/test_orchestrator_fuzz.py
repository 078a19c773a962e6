"""The orchestrator against random model output: a fuzz over the tag vocabulary and text.

A random engine answers every request with random tokens (tags, end-of-sequence, digits,
letters and now and then a well-formed head or a ``</Thread>``, so that blocks do fork), cut
at the request's stop tokens and budget as vLLM does, and now and then fails (degraded).
Over thousands of runs with random limits, the orchestrator never raises; the structure
is always closed (the tree renders to
the tokens, each block has one thread per outline, and a parse guided by the injected
positions rebuilds the same tree); the statistics equal a recount from the generated and
injected flags; every degradation names a kind and a position in the trajectory; and the
streamed ids, concatenated, are the trajectory's.
"""

import asyncio
import itertools
import random

from chars import EOS, char_format

from threadweaver.engine import Completion
from threadweaver.layout import render
from threadweaver.orchestrator import DEGRADATION_KINDS, Limits, Orchestrator
from threadweaver.tree import Block, Text, parse

FMT = char_format()
PIECES = [[t] for t in FMT.tags.structural] + [[EOS]] + [FMT.encode(c) for c in "12:ab "]
HEAD = FMT.encode("<Parallel><Outlines><Outline>1:a</Outline><Outline>2:b</Outline></Outlines>")
RUNS = 3000


class RandomEngine:
    def __init__(self, rng: random.Random, failures: float = 0.02):
        self.rng, self.failures = rng, failures

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        if self.rng.random() < self.failures:
            raise ConnectionError("the engine went away")
        ids = []
        for _ in range(self.rng.randint(0, 8)):
            roll = self.rng.random()
            ids += HEAD if roll < 0.25 else [FMT.tags.thread_end] if roll < 0.4 else self.rng.choice(PIECES)
        for i, token in enumerate(ids[:max_tokens]):
            if token in stop_ids:
                return Completion(tuple(ids[: i + 1]), "stop")
        return Completion(tuple(ids[:max_tokens]), "length")


def chains(nodes, at: int, generated) -> tuple[list[int], int]:
    """(every root-to-leaf count of generated tokens, the position after ``nodes``), by enumeration."""
    options = []
    for node in nodes:
        if isinstance(node, Text):
            options.append([sum(generated[at : at + len(node.ids)])])
            at += len(node.ids)
            continue
        at += len(node.head)
        lengths = []
        for thread in node.threads:
            inner, at = chains(thread.body, at + 1 + len(thread.seed), generated)
            lengths += [n + generated[at] for n in inner]  # its </Thread>, if the model wrote it
            at += 1
        options.append([len(node.head) + n for n in lengths])
        at += 1
    return [sum(choice) for choice in itertools.product(*options)] if options else [0], at


def blocks(nodes):
    for node in nodes:
        if isinstance(node, Block):
            yield node
            for thread in node.threads:
                yield from blocks(thread.body)


def random_limits(rng: random.Random) -> Limits:
    return Limits(
        max_threads=rng.randint(1, 3),
        max_depth=rng.randint(1, 3),
        max_tokens=rng.randint(1, 60),
        max_request_tokens=rng.randint(1, 20),
        concurrent_threads=rng.random() < 0.8,
    )


def test_random_output_never_breaks_the_orchestrator():
    for seed in range(RUNS):
        rng = random.Random(seed)
        limits = random_limits(rng)
        orchestrator = Orchestrator(RandomEngine(rng), FMT, limits, degrade_on_engine_error=True)
        streamed = []
        t = asyncio.run(orchestrator.run(FMT.encode("Q?"), on_tokens=streamed.append))
        where = f"seed {seed}: {FMT.decode(t.token_ids)!r}"
        assert [token for run in streamed for token in run] == list(t.token_ids), where
        assert render(t.nodes, FMT) == list(t.token_ids) and len(t.generated) == len(t.token_ids), where
        assert all([th.number for th in b.threads] == [o.number for o in b.outlines] for b in blocks(t.nodes)), where
        injected = [i for i, g in enumerate(t.generated) if not g]
        assert parse(t.token_ids, FMT, injected=injected).nodes == t.nodes, where
        s = t.stats
        assert s.total_tokens == sum(t.generated) and s.injected_tokens == len(injected), where
        lengths, end = chains(t.nodes, 0, t.generated)
        assert end == len(t.token_ids), where
        assert s.critical_path_tokens == (max(lengths) if limits.concurrent_threads else s.total_tokens), where
        assert all(d.kind in DEGRADATION_KINDS and 0 <= d.position <= len(t.token_ids) for d in t.degradations), where
        assert t.well_formed == (not t.degradations)
        assert sum(r.completion_tokens for r in t.requests) <= limits.max_tokens, where  # a hard cap


class StreamingRandomEngine(RandomEngine):
    """Streams each completion in random runs, then gives it."""

    async def stream(self, prompt_ids, stop_ids, max_tokens, sampling):
        completion = await self.generate(prompt_ids, stop_ids, max_tokens, sampling)
        ids = list(completion.token_ids)
        while ids:
            size = self.rng.randint(1, 4)
            yield tuple(ids[:size])
            ids = ids[size:]
            await asyncio.sleep(0)
        yield completion


def test_tokens_streamed_as_the_engine_makes_them_are_the_trajectory():
    for seed in range(RUNS // 3):
        rng = random.Random(seed)
        limits = random_limits(rng)
        streamed = []
        orchestrator = Orchestrator(StreamingRandomEngine(rng, failures=0.0), FMT, limits)
        t = asyncio.run(orchestrator.run(FMT.encode("Q?"), on_tokens=streamed.append))
        assert [token for run in streamed for token in run] == list(t.token_ids), f"seed {seed}"
