"""Writing the synthetic task's splits as JSONL chat datasets."""

from __future__ import annotations

import os
from dataclasses import asdict

from threadweaver.jsonl import check_outputs, check_writable, write_json, write_jsonl
from threadweaver.rows import TOKENIZER_FIELD
from threadweaver.synth import SynthConfig, chat_row, make_rows

FORMS = ("parallel", "sequential")
SPLITS = ("train", "validation")
TRAIN_PROBLEMS = 12800
"""The default training split: the quickstart's recipe sees each problem once (800 steps x 16 rows)."""
HELD_OUT_PROBLEMS = 200


def synth_splits(config: SynthConfig, n_train: int, n_validation: int, seed: int) -> dict[str, list[dict]]:
    """Train and validation rows; no validation prompt occurs in train."""
    train = make_rows(n_train, seed, config, "train")
    seen = {row["prompt"] for row in train}
    candidates = make_rows(2 * n_validation + 16, seed, config, "validation")
    validation = [row for row in candidates if row["prompt"] not in seen][:n_validation]
    if len(validation) < n_validation:
        raise ValueError(f"only {len(validation)} held-out problems are distinct from train; use more digits")
    return dict(zip(SPLITS, (train, validation), strict=True))


def write_synth(out: str, config: SynthConfig, n_train: int, n_validation: int, seed: int) -> list[str]:
    """``out/{parallel,sequential}/{train,validation}.jsonl`` and ``out/recipe.json``; a path that
    cannot be a file is refused (``ValueError``) before any is written."""
    paths = {(form, split): os.path.join(out, form, f"{split}.jsonl") for form in FORMS for split in SPLITS}
    check_outputs([*paths.values(), os.path.join(out, "recipe.json")], [], named=False)
    check_writable(os.path.join(out, "recipe.json"), atomic=True)  # a folder that cannot be made: /proc/x
    splits = synth_splits(config, n_train, n_validation, seed)
    # digit strings are written for the embedded models' tokenizer; sentences for any model's
    recorded = {TOKENIZER_FIELD: "synth"} if config.task == "digits" else {}
    for (form, split), path in paths.items():
        write_jsonl(path, ({**chat_row(row, form), **recorded} for row in splits[split]))
    recipe = {
        "task": "threadweaver.synth",
        "seed": seed,
        "train": n_train,
        "validation": n_validation,
        "config": asdict(config),
    }
    write_json(os.path.join(out, "recipe.json"), recipe)
    return list(paths.values())
