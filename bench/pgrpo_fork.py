"""P-GRPO teaches a partly forking model to fork, on CPU: three arms over training steps.

    .venv/bin/python bench/pgrpo_fork.py [--parallel-share 0.5] [--steps 60]
                                         [--prompts-per-step 4]
                                         [--learning-rate 3e-5] [--acceleration-clip 0.5]
                                         [--acceleration-form reduction] [--eval 64] [--samples 2]
                                         [--eval-every 15] [--out runs/pgrpo_fork]

1. The starting model: the kit's tiny Qwen3 fine-tuned by ``threadweaver sft`` (tree attention)
   with the quickstart's recipe on its training problems, ``--parallel-share`` of them written in
   the parallel form and the rest sequentially, so it forks on part of the problems. It is
   trained once and kept under ``--out``.
2. Three arms of ``--steps`` P-GRPO steps (``--prompts-per-step`` problems x 8 rollouts at T=1):
   - ``P-GRPO``: :class:`PGRPOConfig` as it is (rewards centred on the group mean);
   - ``std-scaled``: the same with TRL's ``scale_rewards="group"`` (the paper's ablation),
     which ``PGRPOConfig`` refuses, so the bench sets it on the built config;
   - ``sequential``: the quickstart's sequential baseline with ``branching=False``.
3. Every ``--eval-every`` steps, each arm's model decodes the same ``--eval`` held-out problems
   greedily and ``--samples`` times at T=1: the share of trajectories with a parallel block,
   the mean critical path and the accuracy.

Writes ``pgrpo_fork.json`` (after each arm; a rerun with the same settings keeps the arms it holds),
``pgrpo_fork.png`` (the three metrics over steps) and each arm's final model (``<arm>/``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ARMS = ("P-GRPO", "std-scaled", "sequential")
MODES = {"greedy": 0.0, "T=1": 1.0}
METRICS = {"parallel": "parallel share", "critical_path_tokens": "critical path (tokens)", "accuracy": "accuracy"}


def start_model(out: str, parallel_share: float) -> str:
    """The partly forking SFT model (trained once): the quickstart's recipe on mixed-form rows, tree attention."""
    from threadweaver.dataset import write_synth
    from threadweaver.hf_collator import sft
    from threadweaver.jsonl import read_jsonl, write_jsonl
    from threadweaver.kit.models import TinyQwen3Config, tiny_qwen3
    from threadweaver.kit.tokenizers import synth_tokenizer
    from threadweaver.quickstart.recipe import PGRPO_RECIPE, RECIPE

    model = os.path.join(out, "start")
    if os.path.exists(os.path.join(model, "model.safetensors")):
        return model
    data, kit = os.path.join(out, "data"), os.path.join(out, "kit")
    write_synth(data, RECIPE.synth, PGRPO_RECIPE.sft_problems, RECIPE.validation, RECIPE.seed, replace=True)
    forms = {
        form: [row for _, row in read_jsonl(os.path.join(data, form, "train.jsonl"))]
        for form in ("parallel", "sequential")
    }
    rng = random.Random(0)
    mixed = [p if rng.random() < parallel_share else s for p, s in zip(forms["parallel"], forms["sequential"])]
    write_jsonl(os.path.join(data, "mixed.jsonl"), mixed)
    tokenizer = synth_tokenizer()
    tokenizer.save_pretrained(kit)
    tiny_qwen3(tokenizer, TinyQwen3Config()).save_pretrained(kit)
    argv = RECIPE.sft_argv("parallel", kit, data, model)
    argv[1] = os.path.join(data, "mixed.jsonl")
    return sft.main(argv)


def evaluate_all(model, tokenizer, fmt, problems: list[dict], samples: int) -> dict:
    from pgrpo_learning import evaluate

    return {mode: evaluate(model, tokenizer, fmt, problems, t, 1 if t == 0 else samples) for mode, t in MODES.items()}


def run_arm(args, arm: str, path: str, train: list[dict], held_out: list[dict]) -> list[dict]:
    """``--steps`` P-GRPO steps from ``path``; the held-out metrics every ``--eval-every`` steps."""
    import torch
    from datasets import Dataset
    from pgrpo_learning import cpu_config
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from threadweaver.format import Format
    from threadweaver.trl_pgrpo import PGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    fmt = Format.from_tokenizer(tokenizer)
    config = cpu_config(
        args, os.path.join(args.out, arm), acceleration_form=args.acceleration_form, branching=arm != "sequential"
    )
    if arm == "std-scaled":
        config.scale_rewards = "group"  # TRL's own setting, past PGRPOConfig's refusal: the ablation
    curve = []

    class Evaluate(TrainerCallback):
        def on_step_end(self, trainer_args, state, control, **kwargs):
            if state.global_step % args.eval_every == 0 and state.global_step < args.steps:
                record(state.global_step)

    def record(step: int) -> None:
        started = time.perf_counter()
        curve.append({"step": step, **evaluate_all(model, tokenizer, fmt, held_out, args.samples)})
        model.train()
        print(f"[{arm}] step {step}: {summary(curve[-1])} ({time.perf_counter() - started:.0f} s)", flush=True)

    record(0)
    trainer = PGRPOTrainer(
        model, args=config, train_dataset=Dataset.from_list(train), processing_class=tokenizer, callbacks=[Evaluate()]
    )
    trainer.train()
    trainer.save_model()  # with its tokenizer, under --out/<arm>
    model.set_attn_implementation("sdpa")
    record(args.steps)
    return curve


def summary(point: dict) -> str:
    return "; ".join(
        f"{mode}: parallel {r['parallel']:.0%}, critical path {r['critical_path_tokens']:.1f}, "
        f"accuracy {r['accuracy']:.1%}"
        for mode, r in ((m, point[m]) for m in MODES)
    )


def plot(args, curves: dict[str, list[dict]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(MODES), len(METRICS), figsize=(12, 6.5), sharex=True)
    for row, mode in enumerate(MODES):
        for col, (key, label) in enumerate(METRICS.items()):
            ax = axes[row][col]
            for arm, curve in curves.items():
                ax.plot([p["step"] for p in curve], [p[mode][key] for p in curve], marker="o", label=arm)
            ax.set_title(f"{label}, {mode}", fontsize=10)
            if row == len(MODES) - 1:
                ax.set_xlabel("P-GRPO step")
    axes[0][0].legend()
    fig.suptitle(
        f"P-GRPO from a model that forks on part of the problems (acceleration clip {args.acceleration_clip}, "
        f"{args.acceleration_form}); {args.eval} held-out problems"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def finished_arms(path: str, args: argparse.Namespace) -> tuple[dict, dict]:
    """The curves and minutes of the arms an earlier run with the same settings finished ({} if none)."""
    if not os.path.exists(path):
        return {}, {}
    try:
        with open(path) as f:
            earlier = json.load(f)
        settings, curves, minutes = earlier["args"], earlier["curves"], earlier["minutes"]
    except (ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"{path}: not results this bench wrote ({err!r}); move it away to start over") from None
    ignored = ("arms", "out")
    if {k: v for k, v in settings.items() if k not in ignored} != {
        k: v for k, v in vars(args).items() if k not in ignored
    }:
        return {}, {}
    return curves, minutes


def main(args: argparse.Namespace) -> None:
    from threadweaver.jsonl import write_json
    from threadweaver.quickstart.recipe import RECIPE, embedded_models
    from threadweaver.synth import make_rows

    os.makedirs(args.out, exist_ok=True)
    forking = start_model(args.out, args.parallel_share)
    starts = {"P-GRPO": forking, "std-scaled": forking, "sequential": str(embedded_models()["sequential"])}
    held_out = make_rows(args.eval, RECIPE.seed, RECIPE.synth, split="validation")
    train = [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
        for r in make_rows(args.steps * args.prompts_per_step, 5, RECIPE.synth, split="pgrpo")
    ]
    results = os.path.join(args.out, "pgrpo_fork.json")
    curves, minutes = finished_arms(results, args)
    for arm in args.arms:
        if arm in curves:
            print(f"[{arm}] kept from {results} (same settings)", flush=True)
            continue
        started = time.perf_counter()
        curves[arm] = run_arm(args, arm, starts[arm], train, held_out)
        minutes[arm] = (time.perf_counter() - started) / 60
        # after each arm, atomically: an interrupted run keeps what it finished
        write_json(results, {"args": vars(args), "curves": curves, "minutes": minutes})
    curves = {arm: curves[arm] for arm in args.arms}
    plot(args, curves, os.path.join(args.out, "pgrpo_fork.png"))
    print(
        f"\n{args.steps} steps of {args.prompts_per_step} x 8 rollouts at T=1, lr {args.learning_rate}, "
        f"acceleration clip {args.acceleration_clip} ({args.acceleration_form}); {args.eval} held-out problems, "
        f"greedy and {args.samples} samples at T=1"
    )
    print(f"{'arm':<12}{'minutes':>8}  start -> end")
    for arm, curve in curves.items():
        print(f"{arm:<12}{minutes[arm]:>8.1f}  {summary(curve[0])}\n{'':<22}{summary(curve[-1])}")


def parse_args() -> argparse.Namespace:
    from threadweaver.quickstart.recipe import PGRPO_RECIPE as R  # the defaults that made the --pgrpo models
    from threadweaver.reward import ACCELERATION_FORMS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--parallel-share", type=float, default=R.parallel_share, help="share of SFT rows in the parallel form"
    )
    parser.add_argument("--steps", type=int, default=R.steps)
    parser.add_argument(
        "--prompts-per-step", type=int, default=R.prompts_per_step, help="problems per step, 8 rollouts each"
    )
    parser.add_argument("--learning-rate", type=float, default=R.learning_rate)
    parser.add_argument(
        "--acceleration-clip",
        type=float,
        default=R.acceleration_clip,
        help="upper clip of the acceleration gain (the paper's 0.2)",
    )
    parser.add_argument("--acceleration-form", choices=ACCELERATION_FORMS, default=R.acceleration_form)
    parser.add_argument("--eval", type=int, default=64, help="held-out problems")
    parser.add_argument("--samples", type=int, default=2, help="samples per held-out problem at T=1")
    parser.add_argument("--eval-every", type=int, default=15, help="steps between evaluations")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--out", default=os.path.join("runs", "pgrpo_fork"))
    return parser.parse_args()


if __name__ == "__main__":
    main(parse_args())
