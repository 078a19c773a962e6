"""``threadweaver generate``: decode a JSONL file of problems through any engine, resumably."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from threadweaver.batch import check_same_sampling, concurrency_option, problem_jobs, read_problems, run_batch, run_sync
from threadweaver.cli_args import check_counts, option
from threadweaver.jsonl import SET_ASIDE, check_outputs, check_resumable, finished_keys
from threadweaver.orchestrator import Limits, Sampling

from .engines import SERVER_ENGINES, EngineArgs, make_engine, prompt_window, tokenizer_source
from .openai_api import unprepared


@dataclass(frozen=True)
class GenerateArgs:
    problems: str = field(metadata={"help": "JSONL rows with 'messages', 'prompt' or 'prompt_ids' (and an 'id')."})
    out: str = field(metadata={"help": "JSONL trajectories; rows already there are skipped (resume)."})
    model: str | None = option(
        None,
        "Model directory or hub id: the tokenizer, and the weights of in-process engines "
        "(default: where the vLLM or SGLang server reports it loaded the model from).",
    )
    concurrency: int = concurrency_option()
    n: int = option(1, "Samples per problem.")

    def __post_init__(self):
        check_counts(self, ("concurrency", "n"))


def checked_problems(args: GenerateArgs) -> list[tuple[int, str, dict]]:
    """The problem rows, checked before any server is asked or any output touched."""
    check_outputs([args.out], [args.problems])
    check_resumable(args.out)
    try:
        problems = read_problems(args.problems)
    except OSError as err:
        raise ValueError(f"cannot read {args.problems}: {err.strerror}") from None
    if not problems:
        raise ValueError(f"{args.problems} has no problems")
    return problems


async def generate(args: GenerateArgs, engine_args: EngineArgs, limits: Limits, sampling: Sampling):
    """Decode every unfinished (row, sample); returns the :class:`BatchProgress` of this run."""
    from transformers import AutoTokenizer

    from threadweaver.format import Format, missing_tags
    from threadweaver.orchestrator import Orchestrator
    from threadweaver.progress import progress_bar

    def tagged_tokenizer(source: str):
        tokenizer = AutoTokenizer.from_pretrained(source)
        if missing := missing_tags(tokenizer):  # --no-branching too: the orchestrator reads its output for the tags
            then = "serve DIR" if engine_args.engine in SERVER_ENGINES else "give --model DIR"
            raise ValueError(f"{unprepared(missing, source, then)}; generate needs them with --no-branching too")
        return tokenizer

    problems = checked_problems(args)
    engine_args.check_model(args.model)
    tokenizer = tagged_tokenizer(args.model) if args.model else None  # before an in-process engine loads weights
    engine = make_engine(engine_args, args.model)
    try:
        if tokenizer is None:
            source = await tokenizer_source(engine, args.model)
            if source is None:
                raise ValueError("--model is needed to load the tokenizer")
            tokenizer = tagged_tokenizer(source)
        jobs = list(problem_jobs(problems, tokenizer, args.n))  # every prompt checked before the output is touched
        done, set_aside = finished_keys(args.out)
        if done:
            check_same_sampling(args.out, sampling)
        jobs = [j for j in jobs if (j.row_id, j.sample) not in done]
        if set_aside:
            print(
                f"moved {set_aside} lines of {args.out} that are not finished rows (unreadable, or repeats) to "
                f"{args.out}{SET_ASIDE}",
                file=sys.stderr,
            )
        if jobs:  # the servers' model, asked before any trajectory's clock starts: an unreachable server is an
            await prompt_window(engine)  # error, not rows cut at --timeout-s while the first request still retried
        if done:
            print(f"resuming: {len(done)} trajectories already in {args.out}, {len(jobs)} to go", file=sys.stderr)
        orchestrator = Orchestrator(engine, Format.from_tokenizer(tokenizer), limits, sampling)
        bar = progress_bar(total=len(jobs), desc="generate", unit=" traj")

        def report(progress) -> None:
            bar.set_postfix_str(progress.postfix())
            bar.update(1)

        try:
            return await run_batch(
                jobs, orchestrator, args.out, concurrency=args.concurrency, seed=sampling.seed, on_done=report
            )
        finally:
            bar.close()
    finally:
        if hasattr(engine, "aclose"):
            await engine.aclose()


def run(args: GenerateArgs, engine_args: EngineArgs, limits: Limits, sampling: Sampling):
    return run_sync(generate(args, engine_args, limits, sampling))
