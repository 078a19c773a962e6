"""The lm-eval model ``threadweaver``: the orchestrator over a vLLM or SGLang server, or in-process.

``lm_eval run --model threadweaver --model_args base_url=http://127.0.0.1:8000 --tasks tw_math``.
Every ``--model_args`` key is a field of :class:`ModelArgs`, :class:`EngineArgs` or
:class:`Limits`; ``branching=false`` decodes each prompt as one plain request (the
sequential baseline). Sampling comes from the task's ``generation_kwargs``
(``temperature``, ``top_p``, ``top_k``, ``do_sample``, ``max_gen_toks``, ``until``).
Repeats of one document (``repeats: k``) are drawn with seeds ``seed``, ``seed+1``, ...
With ``trajectories=FILE,resume=true`` a rerun takes from FILE every trajectory it holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, fields
from pathlib import Path

from threadweaver.batch import BatchProgress, concurrency_option, decode_many, run_sync, trajectory_row
from threadweaver.cli_args import check_counts, option
from threadweaver.engine import EngineError
from threadweaver.hosts import check_host
from threadweaver.jsonl import appending, check_resumable, check_writable
from threadweaver.model_dirs import check_model_dir
from threadweaver.orchestrator import Limits, Orchestrator, Sampling, Trajectory, generated_text, trajectory_text
from threadweaver.reward import is_correct
from threadweaver.rows import RowReader, plain_ids
from threadweaver.stats import LatencyStats
from threadweaver.vllm_orchestrator.engines import EngineArgs, make_engine, served_elsewhere, tokenizer_source

from . import measured
from .data import GOLD_COLUMN

check_host("lm_eval")

from lm_eval.api.model import LM  # noqa: E402

log = logging.getLogger(__name__)

_LM_EVAL_RUN_ARGS = ("batch_size", "max_batch_size", "device")
"""What lm-eval passes every model; the orchestrator's own batching is ``concurrency``."""


@dataclass(frozen=True)
class ModelArgs:
    model: str | None = option(
        None,
        "Model directory or hub id: the tokenizer, and the weights of in-process engines "
        "(default: the model the vLLM server reports). 'pretrained' is accepted too.",
    )
    tokenizer: str | None = option(None, "Tokenizer, if not the model's.")
    concurrency: int = concurrency_option()
    seed: int | None = option(0, "Seed of the first sample of each prompt.")
    trajectories: str | None = option(
        None,
        "Append each trajectory to this JSONL file as `threadweaver generate` writes it (tokens, tree, "
        "request timings, stats, wall_s), with the lm-eval context and generation kwargs; a rerun appends. "
        "Each row's id is '<task>/<doc_id>' and its sample the repeat.",
    )
    resume: bool = option(
        False,
        "With trajectories: a request whose trajectory the file holds (same id, sample, context and generation "
        "kwargs) is answered from it, not decoded again, so a run that stopped goes on where it was (sampled "
        "tasks too, which lm-eval's --use_cache does not cache).",
    )

    def __post_init__(self):
        check_counts(self, ("concurrency",))
        for name in ("model", "tokenizer"):  # transformers reads ~/m as a hub id
            if isinstance(value := getattr(self, name), str) and value.startswith("~"):
                object.__setattr__(self, name, os.path.expanduser(value))
        if self.trajectories is not None:
            object.__setattr__(self, "trajectories", appendable(self.trajectories))
        elif self.resume:
            raise ValueError("model_args resume=true needs trajectories=FILE, the file to resume from")


def appendable(path: str) -> str:
    """``path`` with ``~`` expanded, refused at once where no file can be appended (a folder, a parent that is
    a file, no write permission); missing folders are made when the first trajectory is written."""
    target = Path(os.path.expanduser(path))
    if target.is_dir():
        raise ValueError(f"trajectories={path}: {target} is a folder, not a file")
    existing = next(p for p in (target, *target.parents) if p.exists())
    if existing != target and not existing.is_dir():
        raise ValueError(f"trajectories={path}: {existing} is a file, not a folder")
    try:
        check_writable(str(target))
        check_resumable(str(target))  # a task's own data file, named in its place, would get trajectories appended
    except ValueError as err:
        raise ValueError(f"trajectories={path}: {err}") from None
    return str(target)


def as_bool(name: str, value) -> bool:
    """A boolean model arg: a bool, or true/false/1/0 in any case (lm-eval passes other words on as strings)."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word not in ("true", "1", "false", "0"):
        raise ValueError(f"model_args {name} must be true or false (or 1 or 0), not {value!r}")
    return word in ("true", "1")


def split_model_args(kwargs: dict) -> tuple[ModelArgs, EngineArgs, Limits]:
    """``--model_args`` as the three dataclasses; an unknown key is an error that lists the known ones."""
    kwargs = {k: v for k, v in kwargs.items() if k not in _LM_EVAL_RUN_ARGS}
    if "pretrained" in kwargs:
        kwargs.setdefault("model", kwargs.pop("pretrained"))
    groups = {cls: {f.name for f in fields(cls)} for cls in (ModelArgs, EngineArgs, Limits)}
    groups[Limits].remove("max_tokens")  # the task's max_gen_toks
    unknown = set(kwargs) - set().union(*groups.values())
    if unknown:
        raise ValueError(
            f"unknown threadweaver model_args {', '.join(sorted(unknown))}; known: "
            f"{', '.join(sorted(set().union(*groups.values(), {'pretrained'})))} (max tokens come from the task's "
            f"max_gen_toks, override with --gen_kwargs max_gen_toks=N)"
        )
    # lm-eval reads None as None; none and null, which the settings' messages and JSON say, are None too
    kwargs = {k: None if isinstance(v, str) and v.strip().lower() in ("none", "null") else v for k, v in kwargs.items()}
    flags = {f.name for cls in groups for f in fields(cls) if f.type in (bool, "bool")}
    kwargs = {k: as_bool(k, v) if k in flags else v for k, v in kwargs.items()}
    args = {cls: cls(**{k: v for k, v in kwargs.items() if k in names}) for cls, names in groups.items()}
    return args[ModelArgs], args[EngineArgs], args[Limits]


def sampling_from(gen_kwargs: dict, seed: int | None) -> tuple[Sampling, int | None, list[str]]:
    """(Sampling, max tokens or None, stop strings) from a task's ``generation_kwargs``."""
    gen_kwargs = dict(gen_kwargs)
    until = gen_kwargs.pop("until", None) or []
    if isinstance(until, str):
        until = [until]
    given = gen_kwargs.pop("temperature", None)
    temperature = Sampling.temperature if given is None else _gen_kwarg("temperature", given, float)
    if gen_kwargs.pop("do_sample", None) is False:
        if temperature > 0 and given is not None:
            _warn_greedy(temperature)
        temperature = 0.0
    max_tokens = gen_kwargs.pop("max_gen_toks", None)
    if max_tokens is not None and (max_tokens := _gen_kwarg("max_gen_toks", max_tokens, int)) < 1:
        raise ValueError(f"generation kwarg max_gen_toks must be at least 1, not {max_tokens}")
    top_p = _gen_kwarg("top_p", gen_kwargs.pop("top_p", Sampling.top_p), float)
    top_k = _gen_kwarg("top_k", gen_kwargs.pop("top_k", Sampling.top_k), int)
    given_seed = gen_kwargs.pop("seed", seed)
    sampling = Sampling(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=None if given_seed is None else _gen_kwarg("seed", given_seed, int),
    )
    if gen_kwargs:
        log.warning("threadweaver ignores generation_kwargs %s", ", ".join(sorted(gen_kwargs)))
    return sampling, max_tokens, list(until)


def _gen_kwarg(name: str, value, kind: type):
    """A generation kwarg (a task's, or ``--gen_kwargs``, which lm-eval passes on as text where it is no
    number) as ``kind``; else a ValueError naming it."""
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool) or (kind is int and isinstance(value, float) and value != number):
        raise ValueError(f"generation kwarg {name} must be a {'whole ' if kind is int else ''}number, not {value!r}")
    return number


_warned_greedy = False


def _warn_greedy(temperature: float) -> None:
    """Once a process: tw_synth and tw_shopping say ``do_sample: false``, which a --gen_kwargs temperature keeps."""
    global _warned_greedy
    if not _warned_greedy:
        _warned_greedy = True
        log.warning(
            "threadweaver: do_sample=false overrides temperature=%s (greedy decoding); to sample, pass "
            "--gen_kwargs do_sample=true,temperature=%s",
            temperature,
            temperature,
        )


def cut_at(text: str, until: list[str]) -> str:
    """A response's text (:func:`trajectory_text`), cut at the first stop string."""
    cuts = [text.index(s) for s in until if s and s in text]
    return text[: min(cuts)] if cuts else text


class ThreadWeaverLM(LM):
    """Only ``generate_until``: parallel reasoning is scored on what it generates."""

    def __init__(self, **kwargs):
        super().__init__()
        self.args, self.engine_args, self.limits = split_model_args(kwargs)
        self.engine = make_engine(self.engine_args, self.args.model)
        try:
            self.tokenizer = run_sync(self._load_tokenizer())
        except BaseException:  # the server cannot be reached, say: its connections close now, not at exit
            run_sync(self.engine.aclose())
            raise
        self.reader = RowReader(self.tokenizer)
        self.fmt = self.reader.fmt
        self._chat_applied = False
        measured.use_tokenizer(self.tokenizer)

    async def _load_tokenizer(self):
        from transformers import AutoTokenizer

        if self.args.model and (served := await served_elsewhere(self.engine, self.args.model)):
            raise ValueError(
                f"the server at base_url serves {served}, not model={self.args.model}: its results would be filed "
                "under model='s name; give model= the folder it serves, or leave model= out"
            )
        source = await tokenizer_source(self.engine, self.args.tokenizer or self.args.model)
        if source is None:
            raise ValueError(
                "the threadweaver model needs tokenizer=... or model=... in --model_args "
                f"(the {self.engine_args.engine} engine does not say which model it serves)"
            )
        try:
            check_model_dir(source, weights=False)  # a missing folder read as a hub id: "Repo id must be in the form"
            return AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError) as err:  # a missing folder, a hub id offline: one line, not a traceback
            if self.args.tokenizer or self.args.model:
                given = "tokenizer=" if self.args.tokenizer else "model="
                raise ValueError(f"cannot load the tokenizer {source!r} ({given} in --model_args): {err}") from None
            raise ValueError(  # a relative folder from where the server started, another machine's, a hub id offline
                f"cannot load the tokenizer of {source!r}, the model the server reports; give its folder here as "
                f"model=DIR in --model_args ({err})"
            ) from None

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.chat_template

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Used by ``--apply_chat_template``; without it, each context is sent as one user turn."""
        self._chat_applied = True
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _prompt_ids(self, context: str) -> list[int]:
        """The context as lm-eval rendered it, or else as one user turn."""
        return plain_ids(self.tokenizer, context) if self._chat_applied else self.reader.prompt({"prompt": context})

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Decode every request; the repeats of a document are its samples 0, 1, ..."""
        by_kwargs: dict[str, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            by_kwargs[_canonical(request.args[1])].append(i)
        from tqdm import tqdm

        bar = tqdm(total=len(requests), desc="threadweaver", unit=" traj", disable=disable_tqdm, dynamic_ncols=True)
        out: list[str | None] = [None] * len(requests)
        earlier = decoded_rows(self.args.trajectories) if self.args.resume else {}
        dump = appending(self.args.trajectories) if self.args.trajectories else contextlib.nullcontext()
        try:
            with dump as append, bar:
                for kwargs, indices in by_kwargs.items():
                    chunk = [requests[i] for i in indices]
                    run_sync(self._generate(kwargs, chunk, indices, out, bar, append, earlier))
        except (KeyboardInterrupt, EngineError) as stopped:  # Ctrl-C, a server gone: lm-eval's CLI prints the note
            stopped.__notes__ = [*getattr(stopped, "__notes__", []), self._how_to_go_on()]  # add_note: Python 3.11
            raise
        return out

    def _how_to_go_on(self) -> str:
        """What a run that stopped or failed says of the trajectories it kept."""
        if self.args.trajectories is None:
            return (
                "no trajectory is kept: with model_args trajectories=FILE,resume=true a rerun goes on where one stops"
            )
        if self.args.resume:
            return f"the trajectories it finished are in {self.args.trajectories}: rerun the same command to go on"
        return (
            f"the trajectories it finished are in {self.args.trajectories}: rerun with resume=true added to "
            "model_args to go on (without it, a rerun decodes them again)"
        )

    async def _generate(self, kwargs: str, requests, indices: list[int], out: list, bar, append, earlier) -> None:
        """Decode ``requests``, which share the generation kwargs ``kwargs`` (as JSON); those ``earlier`` holds
        (:func:`decoded_rows`) are answered from it."""
        sampling, max_tokens, until = sampling_from(requests[0].args[1], self.args.seed)
        limits = self.limits
        if max_tokens is not None:  # max_gen_toks is the trajectory's budget
            limits = dataclasses.replace(limits, max_tokens=max_tokens)
        orchestrator = Orchestrator(self.engine, self.fmt, limits, sampling)
        model = self.tokenizer.name_or_path  # a folder by its real path: ./m, m/ and /abs/m are one model
        model = os.path.realpath(model) if os.path.isdir(model) else model
        settings = {"model": model, "sampling": dataclasses.asdict(sampling)}
        # the cap in force, as files written before a None cap meant it
        settings["limits"] = {**dataclasses.asdict(limits), "max_request_tokens": limits.request_cap}
        decoded_with = _canonical(settings)
        contexts = [request.args[0] for request in requests]
        samples = repeat_indices(requests)
        todo = []
        for position, request in enumerate(requests):
            found = earlier.get((request_id(request), samples[position], contexts[position], kwargs, decoded_with))
            if found is None:
                todo.append(position)
                continue
            token_ids, counts = found
            out[indices[position]] = measured.Response(cut_at(generated_text(token_ids, self.fmt), until), counts)
            bar.update(1)
        if len(todo) < len(requests):
            print(
                f"threadweaver: {len(requests) - len(todo)} of {len(requests)} trajectories taken from "
                f"{self.args.trajectories}",
                file=sys.stderr,
                flush=True,
            )
        prompts = [self._prompt_ids(contexts[position]) for position in todo]
        progress = BatchProgress()
        async for at, trajectory, wall_s in decode_many(
            orchestrator,
            prompts,
            concurrency=self.args.concurrency,
            seed=sampling.seed,
            samples=[samples[position] for position in todo],
        ):
            position = todo[at]
            text = cut_at(trajectory_text(trajectory, self.fmt), until)
            if append is not None:
                request, sample = requests[position], samples[position]
                row = trajectory_row(trajectory, self.fmt, wall_s, limits, id=request_id(request), sample=sample)
                context = {"context": contexts[position], "gen_kwargs": json.loads(kwargs), "decoded_with": settings}
                append({**row, **context, **_graded(request, text)})
            out[indices[position]] = measured.Response(text, _measured(trajectory))
            self.cache_hook.add_partial("generate_until", requests[position].args, text)
            progress.add(trajectory)
            bar.update(1)
            bar.set_postfix_str(progress.postfix())
        if progress.done:
            log.info("threadweaver: mean wall-clock per trajectory: %s", progress.wall_clock())
        if progress.cut_short():
            log.warning("threadweaver: of %d trajectories, %s", progress.done, progress.cut_short())

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("the threadweaver model only generates (generate_until tasks such as tw_math)")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("the threadweaver model only generates (generate_until tasks such as tw_math)")

    def __del__(self):
        if hasattr(getattr(self, "engine", None), "aclose"):
            with contextlib.suppress(Exception):  # at interpreter exit the loop may be gone
                run_sync(self.engine.aclose())


def _measured(trajectory: Trajectory) -> measured.Measured:
    kinds = trajectory.degradation_kinds
    return measured.Measured(trajectory.stats, not kinds, kinds, trajectory.finish_reason)


def _measured_row(row: dict) -> measured.Measured:
    """:func:`_measured` of a trajectory written as a row."""
    kinds = frozenset(d["kind"] for d in row["degradations"])
    return measured.Measured(LatencyStats.from_dict(row["stats"]), not kinds, kinds, row["finish_reason"])


def decoded_rows(path: str) -> dict[tuple, tuple[list[int], measured.Measured]]:
    """The token ids and counts of the trajectories an earlier run wrote to ``path``, by (id, sample, context,
    generation kwargs and the settings they were decoded with (model, sampling with its seed, limits), as JSON);
    a line that is no such row (torn by a crash, or written without them) is passed over, and its request
    decoded again."""
    rows = {}
    if not os.path.isfile(path):
        return rows
    with open(path, "rb") as f:
        for line in f:
            try:
                row = json.loads(line)
                key = (row["id"], row["sample"], row["context"], _canonical(row["gen_kwargs"]))
                rows[(*key, _canonical(row["decoded_with"]))] = (row["token_ids"], _measured_row(row))
            except (ValueError, RecursionError, TypeError, KeyError):
                continue
    return rows


def _canonical(value: dict) -> str:
    """Generation kwargs, or the settings a trajectory was decoded with, as the JSON that keys them."""
    return json.dumps(value, sort_keys=True, default=str)


def request_id(request) -> str:
    """``<task>/<doc_id>``: the same on every run, a rerun that lm-eval's ``--use_cache`` shortens too."""
    return f"{request.task_name}/{request.doc_id}"


def repeat_indices(requests) -> list[int]:
    """Each request's repeat of its document (lm-eval passes an Instance ``repeats`` times): samples 0, 1, ..."""
    seen: Counter = Counter()
    indices = []
    for request in requests:
        key = (request.task_name, request.doc_id, request.idx, request.args[0])
        indices.append(seen[key])
        seen[key] += 1
    return indices


def _graded(request, response: str) -> dict:
    """The gold answer and lm-eval's grade of ``response``, for a document of a tw_* task (others have no
    gold column: nothing)."""
    doc = getattr(request, "doc", None)
    if not isinstance(doc, dict) or doc.get(GOLD_COLUMN) is None:
        return {}
    gold = str(doc[GOLD_COLUMN])
    return {"answer": gold, "correct": is_correct(response, gold)}
