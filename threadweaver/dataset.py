"""Writing the synthetic task's splits as JSONL chat datasets."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

from threadweaver.cli_args import flag
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


def write_synth(
    out: str, config: SynthConfig, n_train: int, n_validation: int, seed: int, replace: bool = False
) -> list[str]:
    """``out/{parallel,sequential}/{train,validation}.jsonl`` and ``out/recipe.json``; a path that
    cannot be a file is refused (``ValueError``) before any is written, and so is an ``out`` that holds another
    dataset (``replace``: the caller owns ``out`` and writes it anew). The same recipe writes the same rows, so
    a rerun of one is taken."""
    paths = {(form, split): os.path.join(out, form, f"{split}.jsonl") for form in FORMS for split in SPLITS}
    recipe_path = os.path.join(out, "recipe.json")
    check_outputs([*paths.values(), recipe_path], [], named=False)
    check_writable(recipe_path, atomic=True)  # a folder that cannot be made: /proc/x
    recipe = {
        "task": "threadweaver.synth",
        "seed": seed,
        "train": n_train,
        "validation": n_validation,
        "config": asdict(config),
    }
    if not replace:
        _check_no_other_dataset(out, list(paths.values()), recipe_path, recipe)
    splits = synth_splits(config, n_train, n_validation, seed)
    write_json(recipe_path, recipe)  # first: a run stopped part way is rerun as the same recipe
    # digit strings are written for the embedded models' tokenizer; sentences for any model's
    recorded = {TOKENIZER_FIELD: "synth"} if config.task == "digits" else {}
    for (form, split), path in paths.items():
        write_jsonl(path, ({**chat_row(row, form), **recorded} for row in splits[split]))
    return list(paths.values())


def _check_no_other_dataset(out: str, paths: list[str], recipe_path: str, recipe: dict) -> None:
    """Refuse an ``out`` whose files another recipe wrote, or no synth run (no synth ``recipe.json``)."""
    held = [os.path.relpath(path, out) for path in [*paths, recipe_path] if os.path.exists(path)]
    if not held:
        return
    try:
        with open(recipe_path) as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        recorded = None
    if recorded == json.loads(json.dumps(recipe)):
        return
    if isinstance(recorded, dict) and recorded.get("task") == recipe["task"]:
        then = {**recorded, **(recorded.get("config") if isinstance(recorded.get("config"), dict) else {})}
        now = {**{key: value for key, value in recipe.items() if key not in ("task", "config")}, **recipe["config"]}
        changed = [f"{flag(key)} {then[key]}" for key, value in now.items() if key in then and then[key] != value]
        raise ValueError(
            f"{out} holds a dataset of another recipe ({', '.join(changed) or 'other settings'}, says its "
            f"recipe.json), which this run would replace: give another --out, or remove {out} first"
        )
    raise ValueError(
        f"{out} holds {', '.join(held)}, which this run would replace, and no synth recipe.json says what made "
        "them: give another --out, or remove them first"
    )
