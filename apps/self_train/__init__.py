"""``threadweaver self-train``: one round of the paper's second stage of data, as one resumable command.

The model samples fork-join trajectories for problems with answers (a vLLM server it starts, or
``--base-url``); ``filter`` keeps the correct, well-formed, parallel ones; stage-1 rows may be mixed
in; ``sft`` fine-tunes the sampling model itself, or a base model, as ``--start`` says (the paper
does not say which). Every step leaves its output in ``OUT``; a rerun skips the steps already done
(``generate`` resumes by itself) and redoes the cheap filter. ``OUT/model`` is the next round's MODEL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from threadweaver.cli_args import check_counts, check_url, option
from threadweaver.engine import Sampling
from threadweaver.selection import FilterConfig


@dataclass(frozen=True)
class SelfTrainArgs:
    model: str = field(metadata={"help": "The model that samples (the stage-1 model): a directory."})
    problems: str = field(metadata={"help": "JSONL problems with 'messages' or 'prompt', an 'id' and an 'answer'."})
    out: str = option("runs/self-train", "Where generated.jsonl, kept.jsonl, train.jsonl and model/ go.")
    start: str = option(
        "model", "Fine-tune 'model' (the one that sampled) or 'base' (--base).", choices=("model", "base")
    )
    base: str | None = option(None, "The base model to fine-tune with --start base.")
    mix: str | None = option(None, "Stage-1 rows (JSONL, any shape sft reads) to train on beside the kept samples.")
    n: int = option(8, "Samples per problem.")
    concurrency: int = option(32, "Trajectories decoded at once.")
    base_url: str | None = option(None, "A vLLM server already serving MODEL (default: start one).")
    max_model_len: int = option(4096, "The started server's longest context plus completion, in tokens.")

    def __post_init__(self):
        check_counts(self, ("n", "concurrency", "max_model_len"))
        if self.base_url is not None:
            check_url(self, "base_url")
        if self.start == "base" and not self.base:
            raise ValueError("--start base needs --base MODEL")
        if self.base and self.start != "base":
            raise ValueError("--base MODEL goes with --start base: without it the sampling model is fine-tuned")
        for path in (self.model, self.problems, self.mix, self.base if self.start == "base" else None):
            if path is not None and not os.path.exists(path):
                raise FileNotFoundError(f"no such file or directory: {path}")


def check_sft_flags(sft_argv: list[str]) -> None:
    """Refuse, before any sampling, flags that ``sft`` would refuse only after it."""
    from threadweaver.hf_collator import sft

    unknown = sft.parser().parse_known_args(["MODEL", "DATA", *sft_argv])[1]
    if unknown:
        raise ValueError(f"sft takes no {' '.join(unknown)} (`threadweaver sft --help` lists its flags)")


def run(args: SelfTrainArgs, sampling: Sampling, filtering: FilterConfig, sft_argv: list[str]) -> dict:
    """The round's summary (also in ``OUT/self_train.json``); ``sft_argv``: more ``sft`` flags."""
    from threadweaver.hf_collator import sft
    from threadweaver.jsonl import read_jsonl, write_json, write_jsonl
    from threadweaver.kit.tokenizers import load_tokenizer
    from threadweaver.rows import RowReader
    from threadweaver.selection import select

    os.makedirs(args.out, exist_ok=True)
    generated, done = os.path.join(args.out, "generated.jsonl"), os.path.join(args.out, "generated.done")
    if not os.path.exists(done):
        print(f"[self-train] sampling {args.n} trajectories per problem with {args.model}", flush=True)
        sample(args, sampling, generated)
        open(done, "w").close()
    print("[self-train] keeping the correct, well-formed, parallel samples", flush=True)
    kept, _, report = select(generated, RowReader(load_tokenizer(args.model)), filtering)
    write_jsonl(os.path.join(args.out, "kept.jsonl"), kept)
    mixed = [row for _, row in read_jsonl(args.mix)] if args.mix else []
    train = os.path.join(args.out, "train.jsonl")
    write_jsonl(train, [*kept, *mixed])
    model_dir = os.path.join(args.out, "model")
    summary = {"filter": report, "kept": len(kept), "mixed": len(mixed), "start": args.start}
    summary["model"] = model_dir if kept or mixed else None
    summary_path = os.path.join(args.out, "self_train.json")
    write_json(summary_path, summary)
    if summary["model"] is None:
        raise ValueError(f"nothing to train on: no sample of {generated} passed the filter (why: {summary_path})")
    if not os.path.exists(os.path.join(model_dir, "trainer_state.json")):
        start = args.model if args.start == "model" else args.base
        print(f"[self-train] fine-tuning {start} on {len(kept)} kept + {len(mixed)} mixed rows", flush=True)
        sft.main([start, train, "--output-dir", model_dir, *sft_argv])
    return summary


def sample(args: SelfTrainArgs, sampling: Sampling, out: str, limits=None) -> None:
    """``generate`` ``args.n`` trajectories per problem into ``out`` (resumable), on ``--base-url`` or a
    vLLM server started for the model and stopped after."""
    from contextlib import nullcontext

    from threadweaver.orchestrator import Limits
    from threadweaver.vllm_orchestrator.engines import EngineArgs
    from threadweaver.vllm_orchestrator.generate import GenerateArgs, checked_problems
    from threadweaver.vllm_orchestrator.generate import run as generate
    from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer

    jobs = GenerateArgs(args.problems, out, model=args.model, concurrency=args.concurrency, n=args.n)
    checked_problems(jobs)  # before a server takes minutes to start
    server = (
        nullcontext()
        if args.base_url
        else VLLMServer(
            ServeArgs(model=args.model, port=0, max_model_len=args.max_model_len, cpu_kv_cache_gib=1),
            log_path=os.path.join(args.out, "server.log"),
        )
    )
    with server as started:
        generate(jobs, EngineArgs(base_url=args.base_url or started.url), limits or Limits(), sampling)
