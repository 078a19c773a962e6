"""Running ``curate`` over a file: the outputs, the progress bar, and the dry run.

``OUT_DIR`` holds ``train.jsonl`` (rows ``threadweaver sft`` reads), ``dropped.jsonl`` (every
dropped trace and block with its stage and reason), ``report.json`` and ``calls.sqlite`` (the call
cache). The three result files are written atomically at the end; the cache as each reply arrives,
so rerunning the same command after a kill pays only for the calls that had not finished.
"""

from __future__ import annotations

import os
import sys

from threadweaver.batch import run_sync
from threadweaver.format import Format, add_tags
from threadweaver.jsonl import read_rows, write_json, write_jsonl

from . import prompts
from .calls import LLM, CallCache
from .config import CurateArgs, CurateConfig, LLMArgs
from .pipeline import Outcome, curate_all, ingest, report, tally


def target_format(spec: str) -> Format:
    """The format of the target tokenizer, with the tags added where it lacks them."""
    from threadweaver.kit.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(spec)
    try:
        return Format.from_tokenizer(tokenizer)
    except ValueError:
        add_tags(tokenizer)
        return Format.from_tokenizer(tokenizer)


def run(args: CurateArgs, llm_args: LLMArgs, config: CurateConfig) -> dict:
    """Curate ``args.traces`` into ``args.out_dir``; the report (also in ``report.json``)."""
    from tqdm import tqdm

    fmt = target_format(args.tokenizer)
    traces, dropped = ingest(read_rows(args.traces), config, fmt.decode)
    if args.dry_run:
        return estimate(traces, dropped, fmt, llm_args, config)
    if not llm_args.model:
        raise ValueError("name the model the endpoint serves: --model NAME")
    cache = CallCache(os.path.join(args.out_dir, "calls.sqlite"))
    bar = tqdm(total=len(traces), desc="curate", unit=" traces", disable=not sys.stderr.isatty())
    done: list[Outcome] = list(dropped)

    def on_done(outcome: Outcome) -> None:
        done.append(outcome)
        bar.update()
        bar.set_postfix(tally(done), refresh=False)

    async def main() -> tuple[list[Outcome], dict]:
        llm = LLM(llm_args, cache)
        try:
            return await curate_all(traces, llm, config, fmt, on_done), llm.usage_dict()
        finally:
            await llm.close()

    try:
        outcomes, usage = run_sync(main())
    finally:
        bar.close()
        cache.close()
    outcomes = sorted([*dropped, *outcomes], key=lambda o: o.line)
    stats = report(outcomes, usage, config)
    stats["llm"] = {"base_url": llm_args.base_url, "model": llm_args.model, "temperature": llm_args.temperature}
    write_jsonl(os.path.join(args.out_dir, "train.jsonl"), (o.row for o in outcomes if o.row is not None))
    write_jsonl(os.path.join(args.out_dir, "dropped.jsonl"), (d for o in outcomes for d in o.drops))
    write_json(os.path.join(args.out_dir, "report.json"), stats)
    return stats


def estimate(traces, dropped: list[Outcome], fmt: Format, llm_args: LLMArgs, config: CurateConfig) -> dict:
    """Tokens and cost, counted with the target tokenizer, as if every trace had one block over its
    whole reasoning and every reply used its whole budget; re-asks and further blocks come on top."""
    prompt = completion = 0
    for trace in traces:
        units = trace.units
        for messages in (
            prompts.segment(trace.problem, units, config.max_threads),
            prompts.decouple(trace.problem, "", units),
            prompts.outline(trace.problem, units),
        ):
            prompt += sum(len(fmt.codec.encode(m["content"])) for m in messages)
            completion += llm_args.max_reply_tokens
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": 0}
    return {
        "dry_run": True,
        "traces": len(traces) + len(dropped),
        "would_curate": len(traces),
        "dropped_at_ingest": len(dropped),
        "estimate": {**usage, "calls": 3 * len(traces), "cost_usd": config.cost(usage)},
    }


def format_estimate(stats: dict) -> str:
    guess = stats["estimate"]
    return (
        f"{stats['would_curate']} of {stats['traces']} traces would be curated "
        f"({stats['dropped_at_ingest']} dropped at ingest)\n"
        f"about {guess['calls']} calls, {guess['prompt_tokens']} prompt and {guess['completion_tokens']} completion "
        f"tokens, {guess['cost_usd']:.4f} USD (one block per trace, every reply at its full budget)"
    )
