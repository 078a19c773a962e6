"""``threadweaver pgrpo``: P-GRPO with :class:`PGRPOTrainer`, as a command.

The trained model is saved with its tokenizer in the plain transformers layout, so
transformers and vLLM load it without threadweaver.
"""

from __future__ import annotations

import json
import os

from threadweaver.pgrpo_args import PGRPOArgs
from threadweaver.report import RowError, read_jsonl


def problem_rows(path: str, chat: bool) -> list[dict]:
    """``{prompt, answer}`` rows for TRL; a row without a prompt or an answer names its line."""
    rows = []
    for line, row in read_jsonl(path):
        if "answer" not in row:
            raise RowError(line, "no 'answer' field (the gold answer the correctness reward grades against)")
        if "messages" in row:
            messages = list(row["messages"])
            while messages and messages[-1].get("role") == "assistant":
                messages.pop()
            if not messages:
                raise RowError(line, "field 'messages' has no turn before the assistant's")
            prompt = messages
        elif isinstance(row.get("prompt"), (str, list)):
            prompt = row["prompt"]
            if isinstance(prompt, str) and chat:
                prompt = [{"role": "user", "content": prompt}]
        else:
            raise RowError(line, "no prompt: expected 'messages' or 'prompt'")
        rows.append({"prompt": prompt, "answer": str(row["answer"])})
    if not rows:
        raise ValueError(f"{path}: no problems")
    return rows


def train(args: PGRPOArgs) -> str:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from threadweaver.trl_pgrpo import PGRPOConfig, PGRPOTrainer

    cuda = torch.cuda.is_available()
    bf16 = cuda and torch.cuda.is_bf16_supported()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    rows = problem_rows(args.data, chat=bool(getattr(tokenizer, "chat_template", None)))
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.bfloat16 if bf16 else torch.float32, attn_implementation="sdpa"
    )
    config = PGRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations,
        learning_rate=args.learning_rate,
        epsilon=args.epsilon,
        epsilon_high=args.epsilon_high,
        acceleration_factor=args.acceleration_factor,
        acceleration_clip=args.acceleration_clip,
        branching=not args.sequential,
        temperature=args.temperature,
        max_completion_length=args.max_completion_length,
        logging_steps=args.logging_steps,
        seed=args.seed,
        use_cpu=not cuda,
        bf16=bf16,
        report_to="none",
        save_strategy="no",
        use_vllm=args.vllm,
        vllm_mode="colocate",
    )
    trainer = PGRPOTrainer(model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train()
    model.set_attn_implementation("sdpa")
    trainer.save_model(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    with open(os.path.join(args.output_dir, "log_history.json"), "w", encoding="utf-8") as f:
        json.dump(trainer.state.log_history, f, indent=1)
    return args.output_dir
