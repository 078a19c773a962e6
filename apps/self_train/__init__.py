"""``threadweaver self-train``: one round of the paper's second stage of data, as one resumable command.

The model samples fork-join trajectories for problems with answers (a vLLM server it starts, or
``--base-url``); ``filter`` keeps the correct, well-formed, parallel ones; stage-1 rows may be mixed
in; ``sft`` fine-tunes the sampling model itself, or a base model, as ``--start`` says (the paper
does not say which). Every step leaves its output in ``OUT``; a rerun skips the steps already done
(``generate`` resumes by itself) and redoes the cheap filter. ``OUT/model`` is the next round's MODEL.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from threadweaver.batch import concurrency_option
from threadweaver.cli_args import check_counts, check_url, given, option
from threadweaver.engine import Sampling
from threadweaver.jsonl import file_digest, not_a_file_of_rows
from threadweaver.model_dirs import check_model_dir
from threadweaver.orchestrator import Limits
from threadweaver.selection import FilterConfig
from threadweaver.vllm_orchestrator.serve import ServeArgs

SAMPLING_TEMPERATURE = 0.6
"""Self-training's sampling temperature unless told (the paper's); plain decoding is greedy unless told."""
GENERATED = "generated.jsonl"
"""The samples in OUT, appended as they finish (``generate`` resumes from them)."""
GENERATED_DONE = "generated.done"
"""Written in OUT once every sample is in :data:`GENERATED`: a rerun samples no more."""


@dataclass(frozen=True)
class SelfTrainArgs:
    model: str = field(metadata={"help": "The model that samples (the stage-1 model): a directory."})
    problems: str = field(metadata={"help": "JSONL problems with 'messages' or 'prompt', an 'id' and an 'answer'."})
    out: str = option("runs/self-train", f"Where {GENERATED}, kept.jsonl, train.jsonl and model/ go.")
    start: str = option(
        "model", "Fine-tune 'model' (the one that sampled) or 'base' (--base).", choices=("model", "base")
    )
    base: str | None = option(None, "The base model to fine-tune with --start base.")
    mix: str | None = option(None, "Stage-1 rows (JSONL, any shape sft reads) to train on beside the kept samples.")
    n: int = option(8, "Samples per problem.")
    concurrency: int = concurrency_option()
    base_url: str | None = option(None, "A vLLM server already serving MODEL (default: start one).")
    max_model_len: int = option(
        ServeArgs.max_model_len, "The started server's longest context plus completion, in tokens."
    )

    def __post_init__(self):
        from threadweaver.vllm_orchestrator.serve import kv_cache_env_problem

        if not self.base_url and (problem := kv_cache_env_problem(os.environ)):
            raise ValueError(problem)  # before the sampling, not when the server starts
        check_counts(self, ("n", "concurrency", "max_model_len"))
        if self.base_url is not None:
            check_url(self, "base_url")
        if self.start == "base" and not self.base:
            raise ValueError("--start base needs --base MODEL")
        if self.base and self.start != "base":
            raise ValueError("--base MODEL goes with --start base: without it the sampling model is fine-tuned")
        for path, flag in ((self.problems, "PROBLEMS"), (self.mix, "--mix")):
            if path is not None and (problem := not_a_file_of_rows(path)):
                raise ValueError(f"{flag} {path}: {problem}")
        check_model_dir(self.model, what="a model directory (self-train takes MODEL, then PROBLEMS)")
        if self.start == "base":
            check_model_dir(self.base, what="a model directory (--base)")
        if os.path.exists(self.out) and not os.path.isdir(self.out):
            raise ValueError(f"--out {self.out}: a file, not a folder")


def check_sft_flags(sft_argv: list[str]) -> None:
    """Refuse, before any sampling, flags that ``sft`` would refuse only after it."""
    from threadweaver.hf_collator import sft

    unknown = sft.parser().parse_known_args(["MODEL", "DATA", *sft_argv])[1]
    if unknown:
        raise ValueError(f"sft takes no {' '.join(unknown)} (`threadweaver sft --help` lists its flags)")
    if own := [arg for arg in sft_argv if given([arg], "--output_dir")]:
        raise ValueError(f"{own[0].split('=')[0]}: self-train trains into OUT/model (--out names OUT)")
    sft.parsed_flags(["MODEL", "DATA", *sft_argv])  # its values: --save-steps 0, --logging-steps inf


def run(args: SelfTrainArgs, sampling: Sampling, filtering: FilterConfig, sft_argv: list[str]) -> dict:
    """The round's summary (also in ``OUT/self_train.json``); ``sft_argv``: more ``sft`` flags."""
    from threadweaver.hf_collator import sft
    from threadweaver.jsonl import write_json, write_jsonl
    from threadweaver.kit.tokenizers import load_tokenizer
    from threadweaver.rows import RowReader
    from threadweaver.selection import select

    start = args.model if args.start == "model" else args.base  # the model fine-tuned
    tokenizer = load_tokenizer(args.model)  # the sampled model's: it reads the problems and grades the samples
    check_problems(args, tokenizer)
    mixed = read_mix(args.mix, tokenizer if start == args.model else load_tokenizer(start)) if args.mix else []
    os.makedirs(args.out, exist_ok=True)
    recipe = Recipe(os.path.join(args.out, "recipe.json"))
    generated, done = os.path.join(args.out, GENERATED), os.path.join(args.out, GENERATED_DONE)
    limits = Limits() if filtering.max_tokens is None else Limits(max_tokens=filtering.max_tokens)
    samples = {
        "model": os.path.realpath(args.model),
        "problems": file_digest(args.problems),
        "n": args.n,
        "sampling": dataclasses.asdict(sampling),
        "max_tokens": limits.max_tokens,
    }
    if os.path.exists(generated) and os.path.getsize(generated):  # samples to go on from (a failed start left none)
        recipe.check("sample", samples, generated)
    recipe.keep("sample", samples)
    if not os.path.exists(done):
        print(f"[self-train] sampling {args.n} trajectories per problem with {args.model}", flush=True)
        sample(args, sampling, limits)
        open(done, "w").close()
    print("[self-train] keeping the correct, well-formed, parallel samples", flush=True)
    kept, _, report = select(generated, RowReader(tokenizer), filtering)
    write_jsonl(os.path.join(args.out, "kept.jsonl"), kept)
    train = os.path.join(args.out, "train.jsonl")
    model_dir = os.path.join(args.out, "model")
    training = {"start": os.path.realpath(start), "rows": rows_digest([*kept, *mixed]), "sft": list(sft_argv)}
    summary = {"filter": report, "kept": len(kept), "mixed": len(mixed), "start": args.start}
    summary["model"] = model_dir if kept or mixed else None
    summary_path = os.path.join(args.out, "self_train.json")
    if summary["model"] is None:
        write_json(summary_path, summary)
        raise ValueError(f"nothing to train on: no sample of {generated} passed the filter (why: {summary_path})")
    trained, checkpoint = os.path.exists(os.path.join(model_dir, sft.TRAINER_STATE)), last_checkpoint(model_dir)
    if trained or checkpoint:
        recipe.check("train", training, model_dir)
    elif not given(sft_argv, "--resume_from_checkpoint"):
        check_nothing_left(model_dir)
    write_jsonl(train, [*kept, *mixed])
    write_json(summary_path, summary)
    if not trained:
        recipe.keep("train", training)
        print(f"[self-train] fine-tuning {start} on {len(kept)} kept + {len(mixed)} mixed rows", flush=True)
        resume = []
        if checkpoint and not given(sft_argv, "--resume_from_checkpoint"):
            print(f"[self-train] going on from {checkpoint}", flush=True)
            resume = ["--resume_from_checkpoint", checkpoint]
        sft.main([start, train, "--output-dir", model_dir, *sft_argv, *resume])
    return summary


def last_checkpoint(model_dir: str) -> str | None:
    """The newest whole ``checkpoint-N`` folder a stopped ``sft`` left in ``model_dir`` (with ``--save-steps
    N``): one cut short as it was saved is passed over."""
    from threadweaver.hf_collator.sft import checkpoints

    whole, _ = checkpoints(model_dir)
    return os.path.join(model_dir, whole[-1]) if whole else None


def check_nothing_left(model_dir: str) -> None:
    """Refuse to fine-tune into OUT/model where a fine-tuning stopped before it finished left files but no whole
    checkpoint: sft would refuse the folder as an earlier run's and say to name another folder, which self-train's
    user does not name."""
    from threadweaver.hf_collator.sft import check_no_earlier_run

    try:
        check_no_earlier_run(model_dir)
    except ValueError:
        raise ValueError(
            f"{model_dir} holds what a fine-tuning stopped before it finished left, with no whole checkpoint to go on "
            f"from: move {model_dir} away, then rerun to fine-tune anew"
        ) from None


def read_mix(path: str, tokenizer) -> list[dict]:
    """The stage-1 rows of ``--mix``, each checked as sft reads it (with the fine-tuned model's ``tokenizer``)
    before any sampling: a bad row names ``--mix``'s file and line, not the merged train.jsonl's."""
    from threadweaver.jsonl import RowError, read_jsonl
    from threadweaver.rows import RowReader

    reader = RowReader(tokenizer)
    rows = []
    try:
        for line, row in read_jsonl(path):  # a line that is not a JSON object: a RowError naming it
            try:
                reader.prompt(row)
                reader.trajectory(row)
            except ValueError as err:
                raise RowError.at(line, err) from None
            rows.append(row)
    except ValueError as err:
        raise ValueError(f"--mix {path}: {err}") from None
    if not rows:
        raise ValueError(f"--mix {path} has no rows")
    return rows


class Recipe:
    """What made each step's output in OUT (``recipe.json``): a rerun whose inputs or settings differ would
    reuse an output they did not make (``generate`` resumes, a trained model is kept), so it is refused."""

    def __init__(self, path: str):
        import json

        self.path = path
        try:
            with open(path) as f:
                self.steps = json.load(f)
        except FileNotFoundError:  # a new OUT, or one made before self-train kept recipes
            self.steps = {}
        except ValueError as err:
            raise ValueError(f"{path}: not JSON ({err}); move it away to go on without its record") from None

    def check(self, step: str, made_of: dict, output: str) -> None:
        before = self.steps.get(step) or {}
        # a key the record lacks was not recorded yet (an older self-train): not a change
        changed = ", ".join(key for key, value in made_of.items() if before.get(key, value) != value)
        if not changed:
            return
        raise ValueError(
            f"{output} was made with other {changed} than this run's (recorded in {self.path}), so "
            f"this run would reuse it: give a new --out, or move {output} away to make it again"
        )

    def keep(self, step: str, made_of: dict) -> None:
        from threadweaver.jsonl import write_json

        self.steps[step] = made_of
        write_json(self.path, self.steps)


def rows_digest(rows: list[dict]) -> str:
    """The SHA-256 of rows as JSON (keys sorted): the same rows, the same digest."""
    import hashlib
    import json

    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True).encode() + b"\n")
    return digest.hexdigest()


def generate_args(args: SelfTrainArgs):
    from threadweaver.vllm_orchestrator.generate import GenerateArgs

    out = os.path.join(args.out, GENERATED)
    return GenerateArgs(args.problems, out, model=args.model, concurrency=args.concurrency, n=args.n)


def check_problems(args: SelfTrainArgs, tokenizer) -> None:
    """Refuse, before OUT is touched or a server takes minutes to start, a problems file that ``generate`` would
    refuse, or with a row the filter could not grade (every sample of it would be dropped)."""
    from threadweaver.batch import problem_jobs
    from threadweaver.jsonl import RowError
    from threadweaver.reward import row_answer
    from threadweaver.vllm_orchestrator.generate import checked_problems

    try:
        problems = checked_problems(generate_args(args))
        for line, _, row in problems:
            row_answer(row, line)
        list(problem_jobs(problems, tokenizer, 1))  # every prompt read with the model's ``tokenizer``
    except RowError as err:
        raise ValueError(f"{args.problems}: {err}") from None


def sample(args: SelfTrainArgs, sampling: Sampling, limits: Limits) -> None:
    """``generate`` ``args.n`` trajectories per problem into :data:`GENERATED` (resumable), on ``--base-url`` or a
    vLLM server started for the model and stopped after."""
    from contextlib import nullcontext

    from threadweaver.batch import run_sync
    from threadweaver.vllm_orchestrator.engines import EngineArgs
    from threadweaver.vllm_orchestrator.generate import run as generate
    from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer, cpu_kv_cache_of_our_own

    server = (
        nullcontext()
        if args.base_url
        else VLLMServer(
            ServeArgs(
                args.model, port=0, max_model_len=args.max_model_len, cpu_kv_cache_gib=cpu_kv_cache_of_our_own(1)
            ),
            log_path=os.path.join(args.out, "server.log"),
        )
    )
    if not args.base_url:
        print(f"[self-train] starting a vLLM server for {args.model} (its log: {server.log_path})", flush=True)
    with server as started:
        if args.base_url:
            run_sync(check_serves_model(args.base_url, args.model))
        generate(generate_args(args), EngineArgs(base_url=args.base_url or started.url), limits, sampling)


async def check_serves_model(url: str, model: str) -> None:
    """Refuse a ``--base-url`` whose server loaded another model than MODEL from this machine's files
    (:func:`~threadweaver.vllm_orchestrator.engines.served_elsewhere`): its samples would train MODEL, recorded as
    MODEL's."""
    from threadweaver.vllm_orchestrator.engines import served_elsewhere
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    engine = VLLMServerEngine(url)
    try:
        root = await served_elsewhere(engine, model)
    finally:
        await engine.aclose()
    if root is not None:
        raise ValueError(
            f"--base-url {url} serves {root}, not MODEL {model}: self-train samples with MODEL (and fine-tunes it "
            "with --start model); serve MODEL there, or leave out --base-url to start a server for it"
        )
