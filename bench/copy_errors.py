"""Where the quickstart's models slip: reference solutions scored teacher-forced, in seconds.

    .venv/bin/python bench/copy_errors.py [--parallel DIR ...] [--sequential DIR ...] [--problems 1000]

Each model reads the reference solutions of ``--problems`` held-out synthetic problems (and as many
of its training problems) in one forward pass per batch: a ThreadWeaver model (``--parallel``) their
parallel form with tree attention, a baseline (``--sequential``) their sequential form; by default
the embedded pair. A problem *slips* where the model's most likely next token differs from the
reference at some trained token. On 200 held-out problems the share that slips equalled the share
greedy decoding got wrong, for each of five models (``apps/quickstart/models/RECIPE.md``), so
this compares recipes on 1000 problems in about a minute instead of decoding them. The first slips
are printed with their context: most are one wrong digit in a copied operand.
"""

from __future__ import annotations

import argparse
import os

BATCH = 16


def slips(model_dir: str, rows: list[dict], form: str, show: int = 0) -> dict:
    """Mean loss, share of problems that slip, and the first ``show`` slips as text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from threadweaver.hf_collator.attention import use_tree_attention
    from threadweaver.hf_collator.collator import TrieCollator
    from threadweaver.trie import IGNORE_INDEX

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    branching = form == "parallel"
    if branching:
        use_tree_attention(model)
    collator = TrieCollator(tokenizer, branching=branching)
    loss = tokens = slipped = 0
    shown = []
    for start in range(0, len(rows), BATCH):
        batch = collator(rows[start : start + BATCH])
        labels = batch.pop("labels")[:, 1:]
        with torch.no_grad():
            logits = model(**batch).logits[:, :-1]
        trained = labels != IGNORE_INDEX
        loss += torch.nn.functional.cross_entropy(logits[trained], labels[trained], reduction="sum").item()
        tokens += trained.sum().item()
        wrong = (logits.argmax(-1) != labels) & trained
        slipped += wrong.any(-1).sum().item()
        for b, t in wrong.nonzero().tolist()[: max(0, show - len(shown))]:
            context = tokenizer.decode(batch["input_ids"][b, max(0, t - 11) : t + 1])
            want, got = (tokenizer.decode([token]) for token in (labels[b, t].item(), logits[b, t].argmax().item()))
            shown.append(f"{rows[start + b]['id']}: …{context!r} then {want!r}, not {got!r}")
    return {"loss": loss / tokens, "slipped": slipped / len(rows), "shown": shown}


def main() -> None:
    from threadweaver.dataset import synth_splits
    from threadweaver.quickstart.recipe import RECIPE, embedded_models
    from threadweaver.synth import chat_row

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parallel", nargs="*", default=[], help="ThreadWeaver model directories")
    parser.add_argument("--sequential", nargs="*", default=[], help="baseline model directories")
    parser.add_argument("--problems", type=int, default=1000, help="held-out problems (and as many training ones)")
    parser.add_argument("--show", type=int, default=10, help="slips to print per model")
    args = parser.parse_args()
    if args.problems < 1:
        parser.error(f"--problems must be at least 1, not {args.problems}")
    models = [(m, "parallel") for m in args.parallel] + [(m, "sequential") for m in args.sequential]
    if not models:
        models = [(str(path), form) for form, path in embedded_models().items()]
    for model, form in models:
        if not os.path.isfile(os.path.join(model, "config.json")):
            parser.error(f"--{form} {model}: not a model directory (no config.json)")
    splits = synth_splits(RECIPE.synth, RECIPE.train, args.problems, RECIPE.seed)
    print(
        f"{args.problems} held-out and {args.problems} training problems of the quickstart recipe (seed {RECIPE.seed})"
    )
    print(f"{'model':<48}{'form':<12}{'held-out slips':>15}{'train slips':>13}{'held-out loss':>15}")
    for model, form in models:
        held_out = slips(model, [chat_row(r, form) for r in splits["validation"]], form, args.show)
        train = slips(model, [chat_row(r, form) for r in splits["train"][: args.problems]], form)
        shares = f"{held_out['slipped']:>15.1%}{train['slipped']:>13.1%}{held_out['loss']:>15.5f}"
        print(f"{os.path.relpath(model):<48}{form:<12}{shares}")
        for line in held_out["shown"]:
            print("    " + line)


if __name__ == "__main__":
    main()
