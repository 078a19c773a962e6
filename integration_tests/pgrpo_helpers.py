"""What the P-GRPO integration tests and their torchrun/vLLM scripts share: the embedded
model in a PGRPOTrainer with small test settings, and recorders of what a step did."""

from __future__ import annotations

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from threadweaver.quickstart.recipe import embedded_models
from threadweaver.synth import chat_row, make_rows
from threadweaver.trl_pgrpo import PGRPOConfig, PGRPOTrainer

GROUP = 4
METRICS = (
    "threadweaver/correct_rate",
    "threadweaver/speedup",
    "threadweaver/parallel_activation",
    "threadweaver/critical_path_tokens",
    "threadweaver/total_tokens",
    "threadweaver/well_formed",
    "rewards/correctness/mean",
    "rewards/acceleration/mean",
)


class Recording:
    """An engine that keeps each (context, completion) it answered."""

    def __init__(self, engine):
        self.engine, self.answered = engine, []

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        completion = await self.engine.generate(prompt_ids, stop_ids, max_tokens, sampling)
        self.answered.append((tuple(prompt_ids), tuple(completion.token_ids)))
        return completion


def dataset(n: int) -> Dataset:
    rows = make_rows(n, 7, split="pgrpo-test")
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows]
    )


def messages_dataset(n: int) -> Dataset:
    """Rows as ``threadweaver synth`` writes them: ``messages`` ending in the solution, and ``answer``."""
    return Dataset.from_list([chat_row(r, "parallel") for r in make_rows(n, 7, split="pgrpo-test")])


def config(tmp_path, **overrides) -> PGRPOConfig:
    settings = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        per_device_train_batch_size=GROUP,
        num_generations=GROUP,
        max_completion_length=640,
        learning_rate=1e-5,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    return PGRPOConfig(**{**settings, **overrides})


def trainer_for(tmp_path, engine=None, **overrides):
    path = str(embedded_models()["parallel"])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return PGRPOTrainer(
        model, args=config(tmp_path, **overrides), train_dataset=dataset(8), processing_class=tokenizer, engine=engine
    )


class Recorder:
    """Wraps the trainer's generate-and-score step to keep what each step produced."""

    def __init__(self, trainer):
        self.steps = []
        inner = trainer._generate_and_score_completions

        def generate_and_score(inputs):
            out = inner(inputs)
            self.steps.append((inputs, list(trainer._trajectories), out))
            return out

        trainer._generate_and_score_completions = generate_and_score
