"""Settings of ``threadweaver sft`` (kept free of torch so the CLI starts fast)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class SFTArgs:
    model: str = field(metadata={"help": "Model directory or hub id (a causal LM in transformers format)."})
    data: str = field(
        metadata={
            "help": "JSONL rows: 'messages', 'prompt' + 'completion', 'text', or 'prompt_ids' + 'completion_ids'."
        }
    )
    output_dir: str = field(default=os.path.join("runs", "sft"), metadata={"help": "Where the model is saved."})
    sequential: bool = field(
        default=False,
        metadata={"help": "Train plain causal sequences (tags as ordinary tokens): the sequential baseline."},
    )
    epochs: float = field(default=1.0, metadata={"help": "Passes over the data."})
    max_steps: int = field(default=-1, metadata={"help": "Stop after this many optimizer steps (-1: use epochs)."})
    learning_rate: float = field(default=1e-4, metadata={"help": "Peak learning rate."})
    lr_scheduler: str = field(default="cosine", metadata={"help": "Learning-rate schedule (transformers names)."})
    warmup: float = field(default=0.0, metadata={"help": "Warm-up steps (an integer) or fraction of all steps."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    batch_size: int = field(default=8, metadata={"help": "Rows per device per step."})
    grad_accum: int = field(default=1, metadata={"help": "Gradient accumulation steps."})
    max_length: int = field(
        default=8192, metadata={"help": "Longest flattened row; longer ones are cut at a pre-order prefix."}
    )
    attention: str = field(
        default="auto",
        metadata={
            "help": "Tree attention backend ('auto': flex_attention on GPU, sdpa on CPU).",
            "choices": ("auto", "sdpa", "eager", "flex_attention"),
        },
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "Training dtype ('auto': bfloat16 on GPUs that support it, else float32).",
            "choices": ("auto", "float32", "bfloat16"),
        },
    )
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Trade compute for activation memory."})
    skip_malformed: bool = field(
        default=False, metadata={"help": "Skip rows that fail to parse (counted in the log) instead of stopping."}
    )
    logging_steps: int = field(default=10, metadata={"help": "Log the loss every this many steps."})
    seed: int = field(default=0, metadata={"help": "Random seed."})
