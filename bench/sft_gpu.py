"""``threadweaver sft`` on a GPU as a user runs it: each tree attention trains the same rows from the same weights.

    python bench/sft_gpu.py [--arms ...] [--steps 12] [--out runs/sft_gpu.json]
    python bench/sft_gpu.py --smoke        # CPU: the dense mask, uncompiled and compiled, in a minute

The model is ``threadweaver kit``'s random Qwen3 and character-level tokenizer, with Qwen3-0.6B's
attention shape (head dim 128, grouped query heads) in two layers: this checks the path, while
bench/tree_attention_gpu.py measures the speed. The rows are ``threadweaver synth``'s parallel
trajectories. Each arm is one ``python -m threadweaver.cli sft`` process with the same seed, rows and
steps, under the command's defaults (on a GPU, TRL's ``--bf16``: float32 weights under bf16 autocast):

* ``dense mask``: ``--attention sdpa``, the oracle the others are compared with;
* ``flex``: ``--attention flex_attention`` (the causal head on flash, the branches on Triton flex);
* ``varlen``: ``--attention varlen``;
* ``flex FA4``: ``--flex_backend FLASH`` (FlashAttention 4, where it is installed; said where not);
* ``..., compiled`` (``dense mask, compiled``, ``flex, compiled``, ``flex FA4, compiled``):
  ``--torch_compile true`` with accelerate's regional compilation
  (``ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=1``), the README's fastest setting; every batch
  has another length, so the layers recompile with dynamic shapes, as a training run does;
* ``flex FA4, compiled, packed``: ``--padding_free true``, a batch's rows packed into one;
* ``..., static shapes``: only where the same FA4 arm without it failed, that arm again with each new
  length recompiled static (``TORCH_DYNAMO_AUTOMATIC_DYNAMIC_SHAPES=0``) and batches padded to a
  multiple of 128, so that a failure of FlashAttention 4 with dynamic shapes shows its way round.

``--arms`` takes these names, e.g. ``--arms "dense mask" "flex FA4, compiled"``.

Per arm: its losses, their difference from the dense mask's at the first step (the same weights
on the same batch) and at worst, TRL's train seconds (compiling included: inductor's cache is shared
by the arms, so a later arm may compile less) and the process's, or the command's last lines where
it failed. One arm's failure does not stop the others; the dense mask's does, as the others need it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

GPU_SHAPE = ["--hidden-size", "1024", "--num-attention-heads", "8", "--num-key-value-heads", "4"]
GPU_SHAPE += ["--intermediate-size", "3072", "--num-hidden-layers", "2", "--max-position-embeddings", "8192"]
"""Qwen3-0.6B's head dim (128) and its query heads' grouping (two a key/value head), in two layers."""
TINY_SHAPE = ["--hidden-size", "64", "--num-hidden-layers", "1"]
STATIC_SHAPES = (("TORCH_DYNAMO_AUTOMATIC_DYNAMIC_SHAPES", "0"),)
"""torch recompiles each new length with static shapes, not dynamic ones."""


@dataclass(frozen=True)
class Arm:
    flags: tuple[str, ...]
    """``threadweaver sft`` flags."""
    compiled: bool = False
    """Each decoder layer compiled (``--torch_compile true``, accelerate's regional compilation)."""
    env: tuple[tuple[str, str], ...] = ()
    if_failed: str | None = None
    """Runs only where this arm failed: the same setting, with what may mend it."""


FLEX = ("--attention", "flex_attention")
FA4 = (*FLEX, "--flex_backend", "FLASH")
FA4_STATIC = (*FA4, "--pad_to_multiple_of", "128")
"""FA4 with static shapes, the batches padded to few lengths (the recompiles stay under torch's limit)."""
ARMS = {
    "dense mask": Arm(("--attention", "sdpa")),
    "dense mask, compiled": Arm(("--attention", "sdpa"), compiled=True),
    "flex": Arm(FLEX),
    "flex, compiled": Arm(FLEX, compiled=True),
    "varlen": Arm(("--attention", "varlen")),
    "flex FA4": Arm(FA4),
    "flex FA4, static shapes": Arm(FA4_STATIC, env=STATIC_SHAPES, if_failed="flex FA4"),
    "flex FA4, compiled": Arm(FA4, compiled=True),
    "flex FA4, compiled, static shapes": Arm(
        FA4_STATIC, compiled=True, env=STATIC_SHAPES, if_failed="flex FA4, compiled"
    ),
    "flex FA4, compiled, packed": Arm((*FA4, "--padding_free", "true"), compiled=True),
}
ORACLE = "dense mask"
GPU_ARMS = [ORACLE, "flex", "flex, compiled", "varlen", *(arm for arm in ARMS if "FA4" in arm)]
SMOKE_ARMS = [ORACLE, "dense mask, compiled"]


def cli(*args: str, env: dict | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``python -m threadweaver.cli``, run outside the repository: ``-m`` puts the working directory first on
    the path, where the source tree's ``threadweaver/`` (the core alone) would hide the installed package."""
    command = [sys.executable, "-m", "threadweaver.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=tempfile.gettempdir())


def last_lines(output: str | bytes | None, count: int = 15) -> str:
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    return "\n".join((output or "").strip().splitlines()[-count:])


def cannot_run(arm: str, cuda: bool) -> str | None:
    """Why the arm cannot run on this machine, or None."""
    from threadweaver.hf_collator.attention import flash_attention_4_missing
    from threadweaver.hf_collator.sft import NEEDS_CUDA

    flags = ARMS[arm].flags
    if not cuda and flags[flags.index("--attention") + 1] in NEEDS_CUDA:
        return "needs CUDA"
    if "FLASH" in flags and (missing := flash_attention_4_missing()):
        return missing
    return None


def skipped(arm: str, cuda: bool, results: dict) -> str | None:
    """Why the arm does not run, or None; a fallback runs only after its arm failed."""
    if why := cannot_run(arm, cuda):
        return why
    base = ARMS[arm].if_failed
    if base and "error" not in results.get(base, {}):
        return f"runs only after {base} fails"
    return None


def train(arm: str, kit: Path, rows: Path, out: Path, args) -> dict:
    """One ``threadweaver sft`` process; its losses and times, or its failure."""
    setting = ARMS[arm]
    command = ["sft", str(kit), str(rows), *setting.flags, "--output-dir", str(out), "--max-steps", str(args.steps)]
    command += ["--per-device-train-batch-size", str(args.batch), "--logging-steps", "1", "--seed", "0"]
    command += ["--torch_compile", "true"] if setting.compiled else []
    env = {**os.environ, **dict(setting.env)}
    if setting.compiled:
        env["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "1"
    start = time.perf_counter()
    try:
        done = cli(*command, env=env, timeout=args.arm_timeout_s)
    except subprocess.TimeoutExpired as stopped:
        return {"error": f"{last_lines(stopped.stderr)}\nstill running after {args.arm_timeout_s:.0f} s: stopped"}
    result: dict = {"process_seconds": round(time.perf_counter() - start, 1)}
    if done.returncode != 0:
        return {**result, "error": last_lines(done.stderr or done.stdout)}
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    result["losses"] = [e["loss"] for e in history if "loss" in e]
    result["train_seconds"] = next((e["train_runtime"] for e in history if "train_runtime" in e), None)
    return result


def compare(results: dict) -> None:
    """Each arm's loss differences from the oracle's, in place."""
    oracle = results.get(ORACLE, {}).get("losses")
    for arm, result in results.items():
        losses = result.get("losses")
        if arm == ORACLE or not oracle or not losses:
            continue
        differences = [abs(a - b) for a, b in zip(losses, oracle)]
        result["first_step_loss_difference"] = differences[0]
        result["max_loss_difference"] = max(differences)
        if len(losses) != len(oracle):
            result["loss_count_differs"] = f"{len(losses)} losses against the dense mask's {len(oracle)}"


def report(results: dict) -> str:
    lines = [f"\n{results['device']}, torch {results['torch']}, {results['date']}: {results['model']}"]
    lines.append(f"{results['steps']} steps of {results['batch']} rows; loss differences from the dense mask's")
    lines.append("arm | trained | first step | worst | train s | process s")
    for arm, r in results["arms"].items():
        if "losses" not in r:
            lines.append(f"{arm} | no: {r.get('skipped') or last_lines(r.get('error'), 1) or '?'}")
            continue
        first, worst = r.get("first_step_loss_difference"), r.get("max_loss_difference")
        cells = [f"{first:.1e}" if first is not None else "-", f"{worst:.1e}" if worst is not None else "-"]
        seconds = f"{r['train_seconds']:.1f}" if r.get("train_seconds") is not None else "-"
        lines.append(
            f"{arm} | {len(r['losses'])} losses, last {r['losses'][-1]:.3f} | {' | '.join(cells)} | "
            f"{seconds} | {r['process_seconds']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), help=f"default: {', '.join(GPU_ARMS)} (GPU)")
    parser.add_argument("--steps", type=int, default=12, help="Optimizer steps an arm trains.")
    parser.add_argument("--batch", type=int, default=8, help="Rows a batch.")
    parser.add_argument("--budget-s", type=float, default=300, help="Skip the arms that would start after this.")
    parser.add_argument("--arm-timeout-s", type=float, default=150, help="Stop an arm that runs longer than this.")
    parser.add_argument("--out", type=Path, default=Path("runs/sft_gpu.json"), help="Results (JSON).")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model, two steps: checks the plumbing.")
    args = parser.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    if args.smoke:
        args.arms, args.steps, args.batch, shape = args.arms or SMOKE_ARMS, 2, 2, TINY_SHAPE
    elif not cuda:
        parser.error("no CUDA device: run with --smoke on CPU")
    else:
        args.arms, shape = args.arms or GPU_ARMS, GPU_SHAPE
    arms = [ORACLE, *(arm for arm in ARMS if arm in args.arms and arm != ORACLE)]  # a fallback after its arm
    results = {
        "device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or 'cpu'})",
        "torch": torch.__version__,
        "date": date.today().isoformat(),
        "steps": args.steps,
        "batch": args.batch,
        "arms": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sft_gpu_") as work:
        work = Path(work)
        made = [cli("kit", "--out", str(work / "kit"), *shape)]
        made.append(
            cli("synth", "--out", str(work / "data"), "--train", str(args.steps * args.batch), "--validation", "1")
        )
        for done in made:
            if done.returncode != 0:
                sys.exit(f"sft_gpu: {done.args[3]} failed:\n{last_lines(done.stderr or done.stdout)}")
        config = json.loads((work / "kit" / "config.json").read_text())
        results["model"] = (
            f"kit Qwen3, {config['num_hidden_layers']} layers, {config['num_attention_heads']} query and "
            f"{config['num_key_value_heads']} key/value heads of {config['head_dim']}, "
            f"vocabulary {config['vocab_size']}"
        )
        rows = work / "data" / "parallel" / "train.jsonl"
        others = [arm for arm in arms[1:] if not cannot_run(arm, cuda)]
        for arm in arms:
            if arm == ORACLE and not others:
                why = "no other arm runs here"
            elif time.perf_counter() - start > args.budget_s:
                why = "time budget"
            else:
                why = skipped(arm, cuda, results["arms"])
            result = (
                {"skipped": why}
                if why
                else train(arm, work / "kit", rows, work / arm.replace(", ", "_").replace(" ", "_"), args)
            )
            results["arms"][arm] = result
            print(f"[{time.perf_counter() - start:.0f} s] {arm}: {result}", flush=True)
            compare(results["arms"])
            args.out.write_text(json.dumps(results, indent=1))
            if arm == ORACLE and "error" in result:
                print("sft_gpu: the dense mask, every arm's reference, failed: the others would too; stopping")
                break
    print(report(results))
    return results


if __name__ == "__main__":
    main()
