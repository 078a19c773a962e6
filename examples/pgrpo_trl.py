"""P-GRPO inside your own TRL script: PGRPOTrainer where you had GRPOTrainer.

    python examples/pgrpo_trl.py MODEL_DIR PROBLEMS.jsonl [OUTPUT_DIR] [MAX_STEPS]

MODEL_DIR is an SFT'd ThreadWeaver model; PROBLEMS.jsonl rows have a 'prompt' (chat
messages) and an 'answer'. The paper's settings are PGRPOConfig's defaults.
"""

import sys

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from threadweaver.trl_pgrpo import PGRPOConfig, PGRPOTrainer

if __name__ == "__main__":  # rollouts grade answers; keep a script's work under the guard
    model_dir, data, out = sys.argv[1], sys.argv[2], (sys.argv[3:] or ["runs/pgrpo_example"])[0]
    gpu = torch.cuda.is_available()
    trainer = PGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(model_dir),
        args=PGRPOConfig(
            output_dir=out,
            max_steps=int((sys.argv[4:] or [100])[0]),
            per_device_train_batch_size=8,
            max_completion_length=1024,
            use_cpu=not gpu,
            bf16=gpu,
            report_to="none",
        ),
        train_dataset=load_dataset("json", data_files=data, split="train"),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    trainer.train()
    trainer.save_model(out)
