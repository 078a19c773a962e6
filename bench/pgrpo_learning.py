"""A short P-GRPO learning demonstration on the synthetic task, on CPU.

    .venv/bin/python bench/pgrpo_learning.py [--steps 40] [--prompts-per-step 1] [--acceleration-clip 0.2]
                                             [--vllm] [--eval 64] [--samples 2] [--out runs/pgrpo_learning]

Starts from the embedded SFT'd ThreadWeaver model (the quickstart's), trains ``--steps``
P-GRPO steps with ``PGRPOTrainer`` (paper defaults but the learning rate; problems x 8
rollouts a step, temperature 1.0; rollouts in-process, or on a colocated vLLM with
``--vllm``) on training problems, and evaluates the model before
and after on the same held-out problems, greedily and sampled at temperature 1.0 (the
rollout distribution): accuracy, well-formed share, mean critical path and total tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from statistics import fmean


def evaluate(model, tokenizer, fmt, problems: list[dict], temperature: float, samples: int = 1) -> dict:
    import torch

    from threadweaver.orchestrator import Orchestrator, Sampling, trajectory_text
    from threadweaver.reward import grade
    from threadweaver.rows import chat_prompt_ids
    from threadweaver.vllm_orchestrator.transformers_engine import TransformersEngine

    engine = TransformersEngine(model, pad_token_id=tokenizer.pad_token_id, max_batch=64)
    orchestrator = Orchestrator(engine, fmt, sampling=Sampling(temperature=temperature))
    prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": p["prompt"]}]) for p in problems]

    async def run():
        return await asyncio.gather(*(orchestrator.run(p) for p in prompts for _ in range(samples)))

    torch.manual_seed(1)
    trajectories = asyncio.run(run())
    golds = [p["answer"] for p in problems for _ in range(samples)]
    return {
        "accuracy": fmean(grade(trajectory_text(t, fmt), g).correct for t, g in zip(trajectories, golds)),
        "well_formed": fmean(t.well_formed for t in trajectories),
        "parallel": fmean(t.stats.blocks > 0 for t in trajectories),
        "critical_path_tokens": fmean(t.stats.critical_path_tokens for t in trajectories),
        "total_tokens": fmean(t.stats.total_tokens for t in trajectories),
        "trajectories": len(trajectories),
    }


def cpu_config(args: argparse.Namespace, output_dir: str, **settings):
    """The benches' ``PGRPOConfig``: ``args``' steps, problems per step (8 rollouts each), learning
    rate and acceleration clip, on CPU in float32, nothing saved; ``settings`` add to it."""
    from threadweaver.trl_pgrpo import PGRPOConfig

    return PGRPOConfig(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=8 * args.prompts_per_step,
        learning_rate=args.learning_rate,
        acceleration_clip=args.acceleration_clip,
        max_completion_length=640,
        logging_steps=5,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=0,
        **settings,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval", type=int, default=64, help="held-out problems")
    parser.add_argument("--samples", type=int, default=2, help="samples per held-out problem at T=1")
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--prompts-per-step", type=int, default=1, help="problems per step, 8 rollouts each")
    parser.add_argument(
        "--acceleration-clip", type=float, default=0.2, help="upper clip of 1 - critical path / total (the paper's 0.2)"
    )
    parser.add_argument("--vllm", action="store_true", help="roll out on TRL's colocated vLLM")
    parser.add_argument("--out", default=os.path.join("runs", "pgrpo_learning"))
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from threadweaver.format import Format
    from threadweaver.quickstart.recipe import embedded_models
    from threadweaver.synth import make_rows
    from threadweaver.trl_pgrpo import PGRPOTrainer

    path = str(embedded_models()["parallel"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    fmt = Format.from_tokenizer(tokenizer)
    held_out = make_rows(args.eval, 0, split="validation")
    train = [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
        for r in make_rows(args.steps * args.prompts_per_step, 5, split="pgrpo")
    ]

    results = {}
    modes = {"greedy": (0.0, 1), "sampled T=1": (1.0, args.samples)}
    for name, (temperature, samples) in modes.items():
        results[f"before, {name}"] = evaluate(model, tokenizer, fmt, held_out, temperature, samples)
    config = cpu_config(args, args.out, use_vllm=args.vllm, vllm_mode="colocate")
    trainer = PGRPOTrainer(model, args=config, train_dataset=Dataset.from_list(train), processing_class=tokenizer)
    started = time.perf_counter()
    trainer.train()
    minutes = (time.perf_counter() - started) / 60
    model.set_attn_implementation("sdpa")
    for name, (temperature, samples) in modes.items():
        results[f"after {args.steps} steps, {name}"] = evaluate(model, tokenizer, fmt, held_out, temperature, samples)

    print(
        f"\nP-GRPO: {args.steps} steps of {args.prompts_per_step} x 8 rollouts, lr {args.learning_rate}, "
        f"acceleration clip {args.acceleration_clip}, rollouts on {'vLLM' if args.vllm else 'the policy'}, "
        f"{minutes:.1f} min of training; {args.eval} held-out problems, {args.samples} samples each at T=1"
    )
    print(f"{'model, decoding':<34}{'accuracy':>9}{'well-formed':>12}{'critical path':>14}{'total tokens':>13}")
    for name, r in results.items():
        print(
            f"{name:<34}{r['accuracy']:>9.1%}{r['well_formed']:>12.1%}{r['critical_path_tokens']:>14.1f}"
            f"{r['total_tokens']:>13.1f}"
        )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "learning.json"), "w") as f:
        json.dump({"results": results, "log_history": trainer.state.log_history, "minutes": minutes}, f, indent=1)


if __name__ == "__main__":
    main()
