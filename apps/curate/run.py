"""Running ``curate`` over a file: the outputs, the progress bar, and the dry run.

``OUT`` holds ``train.jsonl`` (rows ``threadweaver sft`` reads), ``dropped.jsonl`` (every
dropped trace and block with its stage and reason), ``report.json`` and ``calls.sqlite`` (the call
cache). The three result files are written atomically at the end; the cache as each reply arrives,
so rerunning the same command after a kill pays only for the calls that had not finished.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections import Counter

from threadweaver.batch import run_sync
from threadweaver.format import Format, add_tags
from threadweaver.interrupts import Stopped
from threadweaver.jsonl import (
    InputError,
    check_folder,
    check_outputs,
    check_writable,
    not_a_file_of_rows,
    read_rows,
    unreadable_note,
    write_json,
    write_jsonl,
)
from threadweaver.rows import RowReader

from . import prompts
from .calls import LLM, SERVER_FAILURES, CallCache
from .config import CurateArgs, CurateConfig, LLMArgs
from .pipeline import Outcome, curate_all, ingest, report, tally


def target_reader(spec: str) -> RowReader:
    """The reader of the target tokenizer, with the tags added where it lacks them."""
    from threadweaver.kit.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(spec)
    try:
        return RowReader(tokenizer, Format.from_tokenizer(tokenizer))
    except ValueError:
        add_tags(tokenizer)
        return RowReader(tokenizer, Format.from_tokenizer(tokenizer))


class NothingCurated(ValueError):
    """No trace was kept; ``report`` says why. Where an earlier run kept rows (its ``train.jsonl``), no
    output is written (``kept_earlier``); otherwise the three are, ``train.jsonl`` empty, ``dropped.jsonl``
    with every trace's reason."""

    def __init__(self, report: dict, outcomes: list[Outcome], out: str, kept_earlier: bool, written: bool = True):
        drops = next((o.drops for o in outcomes if o.drops), None)
        message = "no trace to curate"
        if drops is not None:
            first, cause = drops[-1], drops[0]  # the trace's drop, and its first block's where it has blocks
            detail = " ".join(first["detail"].split())
            if cause is not first:
                why = " ".join(cause["detail"].split())
                detail = f"{detail}; its first block: {cause['stage']}, {cause['reason']}: {why}"
            detail = detail if len(detail) <= 300 else detail[:300] + "..."
            where = f"line {first['line']}: {first['stage']}, {first['reason']}"
            message = f"nothing kept (the first dropped: {where}: {detail})"
        if kept_earlier:
            message += f"; the outputs in {out} are left as they were"
        elif report["traces"] and written:
            message += f"; why each trace was dropped: {os.path.join(out, 'dropped.jsonl')}"
        elif report["traces"]:
            message += "; nothing was written: every trace was dropped before any call"
        super().__init__(message)
        self.report = report


def run(args: CurateArgs, llm_args: LLMArgs, config: CurateConfig) -> dict:
    """Curate ``args.traces`` into ``args.out``; the report (also in ``report.json``).

    Raises :class:`~threadweaver.interrupts.Stopped` on Ctrl-C (the replies so far stay in the call cache, so a rerun
    resumes), :class:`ConnectionError` where the server answered no trace (the outputs of an earlier run
    stay as they were), and :class:`NothingCurated` where no trace was kept.
    """
    from threadweaver.progress import progress_bar

    check_paths(args)
    reader = target_reader(args.tokenizer)
    fmt = reader.fmt
    try:
        traces, dropped = ingest(read_rows(args.traces), config, reader)
    except InputError as err:
        raise InputError(f"{args.traces}: {err}") from None
    except OSError as err:  # a file that vanished, or that cannot be read
        raise InputError(f"{args.traces}: {err.strerror or err}") from None
    if args.dry_run:
        if not traces:  # as the run itself refuses
            raise NothingCurated(report(dropped, {}, config), dropped, args.out, False, written=False)
        return estimate(traces, dropped, fmt, llm_args, config)
    if not llm_args.model:
        raise ValueError("name the model the endpoint serves: --model NAME")
    train = os.path.join(args.out, "train.jsonl")
    kept_earlier = os.path.exists(train) and os.path.getsize(train) > 0  # rows a run with none must not replace
    if not traces:
        raise NothingCurated(report(dropped, {}, config), dropped, args.out, kept_earlier, written=False)
    if note := unreadable_note(args.traces, (d for o in dropped for d in o.drops)):  # before any call is paid for
        print(f"threadweaver curate: {note}", file=sys.stderr, flush=True)
    new_out = not os.path.exists(args.out)
    cache = CallCache(os.path.join(args.out, CACHE))
    bar = progress_bar(total=len(traces), desc="curate", unit=" traces")
    done: list[Outcome] = list(dropped)
    running: list[asyncio.Task] = []
    base_url = llm_args.base_url

    def on_done(outcome: Outcome) -> None:
        done.append(outcome)
        bar.set_postfix_str(tally(done))
        bar.update()

    async def main() -> tuple[list[Outcome], dict]:
        nonlocal base_url
        running.append(asyncio.current_task())
        llm = LLM(llm_args, cache)
        base_url = llm.base_url
        try:
            return await curate_all(traces, llm, config, fmt, on_done), llm.usage_dict()
        finally:
            await llm.close()

    try:
        outcomes, usage = run_sync(main())
    except KeyboardInterrupt as interrupt:
        _stop(running)
        finished = len(done) - len(dropped)
        raise Stopped(
            f"stopped after {finished} of {len(traces)} traces; rerun the same command to resume: "
            f"the {len(cache)} replies so far are kept in {cache.path} and not asked again",
            interrupt,
        ) from None
    finally:
        bar.close()
        replies = len(cache)
        cache.close()
    outcomes = sorted([*dropped, *outcomes], key=lambda o: o.line)
    try:
        _check_server(outcomes, len(traces), base_url, llm_args.model, args.out)
    except ConnectionError:
        if new_out and not replies:  # the folder this run made holds nothing: gone, as it was
            shutil.rmtree(args.out, ignore_errors=True)
        raise
    stats = report(outcomes, usage, config)
    stats["llm"] = {"base_url": base_url, "model": llm_args.model, "temperature": llm_args.temperature}
    if not stats["kept"] and kept_earlier:
        raise NothingCurated(stats, outcomes, args.out, kept_earlier)
    write_jsonl(train, (o.row for o in outcomes if o.row is not None))
    write_jsonl(os.path.join(args.out, "dropped.jsonl"), (d for o in outcomes for d in o.drops))
    write_json(os.path.join(args.out, "report.json"), stats)
    if not stats["kept"]:
        raise NothingCurated(stats, outcomes, args.out, kept_earlier)
    return stats


RESULTS = ("train.jsonl", "dropped.jsonl", "report.json")
"""The files a run writes in ``OUT`` at the end."""
CACHE = "calls.sqlite"
"""The call cache in ``OUT``, written as each reply arrives."""


def check_paths(args: CurateArgs) -> None:
    """Refuse, before any trace is read (the dry run too), an ``OUT`` that is a file or lies under one, traces
    that are not a file of rows, an output that is the traces file (by any name) or a folder, and a call cache
    that cannot be written; :class:`ValueError` names the path."""
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"OUT {args.out}: a file, not a folder")
    check_folder(args.out)
    if problem := not_a_file_of_rows(args.traces):
        raise InputError(f"{args.traces}: {problem}")
    check_outputs([os.path.join(args.out, name) for name in (*RESULTS, CACHE)], [args.traces], named=False)
    check_writable(os.path.join(args.out, CACHE))  # where no reply could be kept, none is paid for


def _stop(running: list[asyncio.Task]) -> None:
    """Cancel the run's task where Ctrl-C left it, and let it unwind: its traces stop, the client closes."""
    if not running:
        return
    task = running[0]
    if task.done():
        _ = task.cancelled() or task.exception()  # retrieved, so that it is not logged at exit
        return
    task.get_loop().call_soon_threadsafe(task.cancel)
    try:
        run_sync(asyncio.wait([task]))
    except KeyboardInterrupt:  # a second Ctrl-C: leave it
        pass


def _check_server(outcomes: list[Outcome], curated: int, base_url: str | None, model: str, out: str) -> None:
    """:class:`ConnectionError` where every trace that reached the LLM failed at the server."""
    failed = [o.drops[-1] for o in outcomes if o.drops and o.drops[-1]["stage"] == "segment"]
    failed = [d for d in failed if d["reason"] in SERVER_FAILURES]
    if not curated or len(failed) < curated:
        return
    reason, count = Counter(d["reason"] for d in failed).most_common(1)[0]
    example = next(d["detail"] for d in failed if d["reason"] == reason).removeprefix(f"{base_url}: ")
    raise ConnectionError(
        f"nothing curated: every one of the {curated} traces failed at the server {base_url} "
        f"({count} {reason}: {' '.join(example.split())}); is it up, and serving --model {model}? "
        f"The outputs in {out} are left as they were"
    )


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
        "first_dropped": dropped[0].drops[0] if dropped else None,
        "estimate": {**usage, "calls": 3 * len(traces), "cost_usd": config.cost(usage)},
    }


def format_estimate(stats: dict) -> str:
    guess = stats["estimate"]
    first = ""
    if drop := stats.get("first_dropped"):  # its line and why, as the run's refusal names them
        detail = " ".join(drop["detail"].split()).removeprefix(f"line {drop['line']}: ")
        detail = detail if len(detail) <= 300 else detail[:300] + "..."
        first = f"the first dropped: line {drop['line']}: {drop['stage']}, {drop['reason']}: {detail}\n"
    return (
        f"{stats['would_curate']} of {stats['traces']} traces would be curated "
        f"({stats['dropped_at_ingest']} dropped at ingest)\n{first}"
        f"about {guess['calls']} calls, {guess['prompt_tokens']} prompt and {guess['completion_tokens']} completion "
        f"tokens, {guess['cost_usd']:.4f} USD (one block per trace, every reply at its full budget)"
    )
