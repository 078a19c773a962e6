"""``threadweaver curate``: sequential traces in, parallel SFT rows out (stage 1 of the data).

Stages, per trace (LLM stages ask for JSON under a schema; code stages check everything they can):

1. ``ingest`` (code): read the row, cut the reasoning into units, grade the original answer.
2. ``segment`` (LLM): parallel blocks as ranges of unit numbers.
3. ``extract`` (code): a block holds if its threads tile it in order, 2..``max_threads`` of them,
   with ``min_parallel_chars`` of work outside the longest thread; blocks do not overlap. Where no
   proposed block holds, ``segment`` is asked again with each block's complaint (``reasks``).
4. ``decouple`` (LLM, per block): find/replace edits so no thread relies on a sibling; each must
   match exactly once, be small, and change a thread by at most ``max_change``.
5. ``outline`` (LLM, per block): exactly one outline per thread, no tags.
6. ``verify`` (code): strict parse with the target tokenizer, exact round trip of the text, the
   answer graded again, the speedup and length bounds.

Every trace ends as a training row or with a reason (and every dropped block has one too), in
``dropped.jsonl`` and counted in ``report.json``.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from statistics import mean, quantiles

from threadweaver.format import OUTLINES, PARALLEL, THREAD, Format
from threadweaver.jsonl import RowError, row_name
from threadweaver.reward import agrade, grade
from threadweaver.rows import RowReader, tokenizer_field
from threadweaver.stats import latency_stats
from threadweaver.tree import TrajectoryFormatError, parse

from . import prompts
from .blocks import Block, NoBlockHolds, Refused, apply_edits, assemble, extract_all, with_outlines, without_overlaps
from .calls import LLM, CallFailed
from .config import CurateConfig
from .schemas import Decoupling, Outlines, Segmentation, segmentation_schema
from .traces import Trace, to_trace

STAGES = ("ingest", "segment", "extract", "decouple", "outline", "verify")


@dataclass
class Outcome:
    """What became of one trace: its row, or the stage and reason that dropped it; dropped blocks too."""

    id: str
    line: int
    passed: list[str] = field(default_factory=list)
    """The stages it passed, in order."""
    blocks: Counter = field(default_factory=Counter)
    """Blocks that passed each stage (``proposed``: the ones the LLM named)."""
    drops: list[dict] = field(default_factory=list)
    row: dict | None = None
    stats: dict | None = None

    def drop(self, stage: str, reason: str, detail: str, block: int | None = None) -> Outcome:
        self.drops.append(
            {"id": self.id, "line": self.line, "stage": stage, "block": block, "reason": reason, "detail": detail}
        )
        return self


def ingest(
    rows: Iterable[tuple[int, dict | RowError]], config: CurateConfig, reader: RowReader | None = None
) -> tuple[list[Trace], list[Outcome]]:
    """The traces that pass ingest, and the outcomes of the rows that do not; ``reader`` reads
    ``prompt_ids`` (None: a row must give its problem as text)."""
    traces, dropped = [], []
    first_line: dict[tuple[str, str], int] = {}  # (prompt, response) -> the line that gave it first
    for line, row in rows:
        if config.limit is not None and len(traces) + len(dropped) >= config.limit:
            break
        if isinstance(row, RowError):
            dropped.append(Outcome(f"line-{line}", line).drop("ingest", "unreadable", str(row)))
            continue
        outcome = Outcome(row_name(row, line), line)
        try:
            trace = to_trace(row, line, reader)
            _usable(trace, config)
        except RowError as err:
            dropped.append(outcome.drop("ingest", "unreadable", str(err)))
        except Refused as err:
            dropped.append(outcome.drop("ingest", err.reason, str(err)))
        else:
            key = (json.dumps(trace.prompt, sort_keys=True), trace.response)
            if key in first_line:  # the same rewrite, paid for again and trained on twice
                detail = f"the same prompt and response as line {first_line[key]}"
                dropped.append(outcome.drop("ingest", "duplicate", detail))
                continue
            first_line[key] = line
            traces.append(trace)
    return traces, dropped


def _usable(trace: Trace, config: CurateConfig) -> None:
    if tag := next((t for t in (PARALLEL, THREAD, OUTLINES) if t in trace.response), None):
        raise Refused("already_parallel", f"the response holds {tag}: it is parallel already (train on it as it is)")
    if len(trace.units) < 2:
        raise Refused("too_few_units", f"{len(trace.units)} reasoning lines; a block needs 2")
    if len(trace.units) > config.max_units:
        raise Refused("too_many_units", f"{len(trace.units)} reasoning lines; at most {config.max_units}")
    graded = grade(trace.response, trace.answer)
    if not graded.correct:
        raise Refused("wrong_answer", f"the original answer is wrong ({graded.detail})")


async def curate_trace(trace: Trace, llm: LLM, config: CurateConfig, fmt: Format, out: Outcome) -> Outcome:
    """``out`` (a trace that passed ingest) filled in stage by stage."""
    messages = prompts.segment(trace.problem, trace.units, config.max_threads)
    schema = segmentation_schema(len(trace.units), config.max_threads)

    def holding(reply: Segmentation):
        return len(reply.blocks), *extract_all(trace, reply, config.max_threads, config.min_parallel_chars)

    try:  # a reply none of whose blocks holds is asked again with each block's complaint
        proposed, candidates, refused = await llm.ask("segment", messages, Segmentation, holding, schema=schema)
    except NoBlockHolds as err:
        proposed, candidates, refused = err.proposed, [], err.refused
    except (CallFailed, Refused) as err:
        return out.drop("segment", err.reason, err.detail)
    out.blocks["proposed"] = proposed
    if not proposed:
        return out.drop("segment", "no_block", "the LLM found nothing to run in parallel")
    out.passed.append("segment")

    for index, err in refused:
        out.drop("extract", err.reason, err.detail, index)
    blocks, overlapping = without_overlaps([b for _, b in candidates])
    index_of = {id(b): i for i, b in candidates}
    for _, block in overlapping:
        out.drop("extract", "block_overlap", "overlaps a block that starts earlier", index_of[id(block)])
    if not _stage_passed(out, "extract", blocks):
        return out

    async def decouple(block: Block) -> Block:
        before = trace.lead + "".join(trace.units[: block.start])
        messages = prompts.decouple(trace.problem, before, block.threads)
        return await llm.ask(
            "decouple",
            messages,
            Decoupling,
            lambda reply: apply_edits(block, reply.edits, config.max_edit_chars, config.max_change),
        )

    async def outline(block: Block) -> Block:
        messages = prompts.outline(trace.problem, block.threads)
        return await llm.ask("outline", messages, Outlines, lambda reply: with_outlines(block, reply.outlines))

    for stage, rewrite in (("decouple", decouple), ("outline", outline)):
        results = await asyncio.gather(*(rewrite(b) for b in blocks), return_exceptions=True)
        kept = []
        for block, result in zip(blocks, results):
            if isinstance(result, (CallFailed, Refused)):
                out.drop(stage, result.reason, result.detail, index_of[id(block)])
            elif isinstance(result, BaseException):
                raise result
            else:
                index_of[id(result)] = index_of[id(block)]
                kept.append(result)
        blocks = kept
        if not _stage_passed(out, stage, blocks):
            return out

    text = assemble(trace, blocks)
    try:
        out.stats = await verify(trace, text, fmt, config)
    except Refused as err:
        return out.drop("verify", err.reason, str(err))
    out.passed.append("verify")
    out.row = {
        "id": trace.id,
        **trace.fields,
        "messages": [*trace.prompt, {"role": "assistant", "content": text}],
        "answer": trace.answer,
        **tokenizer_field(fmt),
    }
    return out


def _stage_passed(out: Outcome, stage: str, blocks: list[Block]) -> bool:
    out.blocks[stage] = len(blocks)
    if not blocks:
        out.drop(stage, "no_block", "no block of the trace passed this stage")
        return False
    out.passed.append(stage)
    return True


async def verify(trace: Trace, text: str, fmt: Format, config: CurateConfig) -> dict:
    """The trajectory's latency statistics, if it passes every check; else :class:`Refused`."""
    try:
        ids = fmt.encode(text)
    except ValueError as err:
        raise Refused("untokenizable", str(err)) from None
    if fmt.decode(ids) != text:
        raise Refused("round_trip", "the target tokenizer does not give the text back exactly")
    try:
        parsed = parse(ids, fmt, strict=True, max_depth=1)
    except TrajectoryFormatError as err:
        raise Refused("malformed", str(err)) from None
    graded = await agrade(text, trace.answer)
    if not graded.correct:
        raise Refused("wrong_after", f"the rewritten answer is wrong ({graded.detail})")
    stats = latency_stats(parsed.nodes, fmt.tags)
    if stats.speedup < config.min_speedup:
        raise Refused("low_speedup", f"speedup {stats.speedup:.3f}x; at least {config.min_speedup}x wanted")
    if config.max_tokens is not None and stats.total_tokens > config.max_tokens:
        raise Refused("too_long", f"{stats.total_tokens} tokens; at most {config.max_tokens}")
    return stats.as_dict()


async def curate_all(
    traces: list[Trace],
    llm: LLM,
    config: CurateConfig,
    fmt: Format,
    on_done: Callable[[Outcome], None] = lambda outcome: None,
) -> list[Outcome]:
    """Every trace's outcome, in input order; ``concurrency`` x 2 traces in flight, none started past ``max_cost``."""
    room = asyncio.Semaphore(2 * llm.args.concurrency)

    async def one(trace: Trace) -> Outcome:
        async with room:
            spent = sum(config.cost(u) for u in llm.usage_dict().values())
            outcome = Outcome(trace.id, trace.line, passed=["ingest"])
            if config.max_cost is not None and spent >= config.max_cost:
                outcome.drop("segment", "max_cost", f"{spent:.4f} USD spent; --max-cost is {config.max_cost}")
            else:
                try:
                    await curate_trace(trace, llm, config, fmt, outcome)
                except Exception as err:  # a fault of ours or an odd reply ends this trace, not the run
                    stage = STAGES[len(outcome.passed)]
                    outcome.drop(stage, "error", f"{type(err).__name__}: {err}")
        on_done(outcome)
        return outcome

    tasks = [asyncio.ensure_future(one(t)) for t in traces]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:  # cancelled (Ctrl-C): the traces still running stop too, before the client closes
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        for task in tasks:  # retrieved, so that none is logged as never retrieved
            _ = task.cancelled() or task.exception()
        raise


def report(outcomes: list[Outcome], usage: dict[str, dict], config: CurateConfig) -> dict:
    """The funnel per stage, the reasons, what was kept, and the tokens and cost per stage."""
    reasons: dict[str, Counter] = {stage: Counter() for stage in STAGES}
    for o in outcomes:
        for d in o.drops:
            reasons[d["stage"]][d["reason"]] += 1
    kept = [o for o in outcomes if o.row is not None]
    speedups = sorted(o.stats["speedup"] for o in kept)
    threads = [n for o in kept for n in o.stats["threads_per_block"]]
    tokens = {stage: {**u, "cost_usd": config.cost(u)} for stage, u in usage.items()}
    return {
        "traces": len(outcomes),
        "kept": len(kept),
        "funnel": {
            "traces": {stage: sum(stage in o.passed for o in outcomes) for stage in STAGES},
            "blocks": {stage: sum(o.blocks[stage] for o in outcomes) for stage in ("proposed", *STAGES[2:5])}
            | {"kept": len(threads)},
        },
        "dropped": {stage: dict(c.most_common()) for stage, c in reasons.items() if c},
        "threads_kept": sum(threads),
        "threads_per_block": dict(sorted(Counter(threads).items())),
        "speedup": _distribution(speedups),
        "tokens": tokens,
        "cost_usd": sum(t["cost_usd"] for t in tokens.values()),
        "config": asdict(config),
    }


def _distribution(values: list[float]) -> dict | None:
    if not values:
        return None
    q = quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    edges = [1.0, 1.25, 1.5, 2.0, 3.0, float("inf")]
    histogram = {
        f"{lo:g}-{hi:g}x" if hi != float("inf") else f">={lo:g}x": sum(lo <= v < hi for v in values)
        for lo, hi in zip(edges, edges[1:])
    }
    return {
        "mean": mean(values),
        "min": values[0],
        "p25": q[0],
        "median": q[1],
        "p75": q[2],
        "max": values[-1],
        "histogram": histogram,
    }


def format_report(stats: dict) -> str:
    funnel = stats["funnel"]
    lines = [f"traces {stats['traces']}, kept {stats['kept']}"]
    lines.append("traces passing " + ", ".join(f"{s} {n}" for s, n in funnel["traces"].items()))
    lines.append("blocks passing " + ", ".join(f"{s} {n}" for s, n in funnel["blocks"].items()))
    for stage, counts in stats["dropped"].items():
        lines.append(f"dropped at {stage:<9}" + ", ".join(f"{r} {n}" for r, n in counts.items()))
    if stats["speedup"]:
        s = stats["speedup"]
        lines.append(
            f"speedup of kept: mean {s['mean']:.3f}x, median {s['median']:.3f}x, {s['min']:.3f}-{s['max']:.3f}x"
        )
    calls = sum(t["calls"] for t in stats["tokens"].values())
    hits = sum(t["cache_hits"] for t in stats["tokens"].values())
    used = sum(t["prompt_tokens"] + t["completion_tokens"] for t in stats["tokens"].values())
    lines.append(f"LLM calls {calls} (+{hits} from the cache), {used} tokens, {stats['cost_usd']:.4f} USD")
    return "\n".join(lines)


def tally(outcomes: Iterable[Outcome]) -> str:
    """For a progress bar: kept, and dropped per stage (``kept=3, segment=1``)."""
    counts = Counter("kept" if o.row is not None else o.drops[-1]["stage"] for o in outcomes)
    return ", ".join(f"{name}={count}" for name, count in counts.items())
