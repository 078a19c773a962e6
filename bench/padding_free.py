"""Padded against padding-free trie batches: one ``threadweaver sft`` run each way, side by side.

    .venv/bin/python bench/padding_free.py [MODEL DATA] [--steps 40] [--batch-size 8]
                                           [--attention auto] [--repeats 2] [--out runs/padding_free]

Without MODEL and DATA it trains the kit's tiny Qwen3 on 1,600 synthetic problems (``threadweaver
kit`` and ``threadweaver synth`` into ``--out``). Each arm trains the same steps from
the same model on the same batches, as the command runs them, with ``--padding_free`` false
(rows padded to the longest of the batch) or true (the batch's rows packed into one, each its own
tree). The arms alternate, ``--repeats`` times each. It prints each arm's median training time
(TRL's ``train_runtime``), its speed against padded, and the largest difference of their logged
losses, which should be float rounding: the same tokens under the same trees.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

from threadweaver.testing import CLI

ARMS = ("padded", "packed")


def sft(model: str, data: str, out: str, padding_free: bool, args) -> dict:
    """One training run of the command, in a process of its own; its log history."""
    shutil.rmtree(out, ignore_errors=True)  # the bench run again: trained anew
    command = [CLI, "sft", model, data, "--output-dir", out]
    command += ["--padding_free", str(padding_free).lower(), "--attention", args.attention]
    command += ["--max-steps", str(args.steps), "--per-device-train-batch-size", str(args.batch_size)]
    command += ["--logging-steps", str(max(1, args.steps // 4)), "--save_strategy", "no"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"threadweaver sft failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(out, "trainer_state.json")) as f:
        history = json.load(f)["log_history"]
    return {
        "seconds": next(e["train_runtime"] for e in history if "train_runtime" in e),
        "losses": [e["loss"] for e in history if "loss" in e],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="Model directory (default: the kit's, made under --out).")
    parser.add_argument("data", nargs="?", help="Training rows, JSONL (default: the quickstart's synthetic ones).")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--attention", default="auto", help="threadweaver sft's --attention.")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=os.path.join("runs", "padding_free"))
    args = parser.parse_args()
    if (args.model is None) != (args.data is None):
        parser.error("give MODEL and DATA, or neither")

    from threadweaver.cli import main as cli

    os.makedirs(args.out, exist_ok=True)
    model, data = args.model, args.data
    if model is None:
        model, data = os.path.join(args.out, "kit"), os.path.join(args.out, "data", "parallel", "train.jsonl")
        if not os.path.exists(os.path.join(model, "config.json")):
            cli(["kit", "--out", model])
        if not os.path.exists(data):
            cli(["synth", "--out", os.path.join(args.out, "data"), "--train", "1600"])
    runs = {arm: [] for arm in ARMS}
    for repeat in range(args.repeats):
        for arm in ARMS:
            run = sft(model, data, os.path.join(args.out, f"{arm}-{repeat}"), arm == "packed", args)
            runs[arm].append(run)
            print(f"{arm}, run {repeat + 1}: {run['seconds']:.1f} s, losses {run['losses']}", flush=True)
    seconds = {arm: statistics.median(run["seconds"] for run in runs[arm]) for arm in ARMS}
    difference = max(
        abs(a - b) for p, q in zip(runs["padded"], runs["packed"]) for a, b in zip(p["losses"], q["losses"])
    )
    print(f"\n{model}, {data}: {args.steps} steps of {args.batch_size} rows, --attention {args.attention}")
    print("| arm | training time (median) | speed against padded |\n|---|---|---|")
    for arm in ARMS:
        print(f"| {arm} | {seconds[arm]:.1f} s | {seconds['padded'] / seconds[arm]:.2f}x |")
    print(f"largest difference of the logged losses: {difference:.2e}")


if __name__ == "__main__":
    main()
