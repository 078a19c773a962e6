"""P-GRPO inside your own TRL script: PGRPOTrainer where you had GRPOTrainer.

    python examples/pgrpo_trl.py MODEL_DIR PROBLEMS.jsonl [--output-dir DIR] [--max-steps N]

MODEL_DIR is an SFT'd ThreadWeaver model; PROBLEMS.jsonl rows have a 'prompt' (a question,
or chat messages) or 'messages' (as `threadweaver synth` writes them), and an 'answer'.
The paper's settings are PGRPOConfig's defaults.
"""

import argparse

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from threadweaver.trl_pgrpo import PGRPOConfig, PGRPOTrainer

if __name__ == "__main__":  # rollouts grade answers; keep a script's work under the guard
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="an SFT'd ThreadWeaver model")
    parser.add_argument("data", help="JSONL problems: 'prompt' or 'messages', and 'answer'")
    parser.add_argument("--output-dir", default="runs/pgrpo_example")
    parser.add_argument("--max-steps", type=int, default=100)
    options = parser.parse_args()
    gpu = torch.cuda.is_available()
    trainer = PGRPOTrainer(
        # float32 weights (under autocast with bf16): steps of about the learning rate round away on bf16 weights
        AutoModelForCausalLM.from_pretrained(options.model_dir, dtype=torch.float32),
        args=PGRPOConfig(
            output_dir=options.output_dir,
            max_steps=options.max_steps,
            per_device_train_batch_size=8,
            max_completion_length=1024,
            use_cpu=not gpu,
            bf16=gpu,
            report_to="none",
        ),
        train_dataset=load_dataset("json", data_files=options.data, split="train"),
        processing_class=AutoTokenizer.from_pretrained(options.model_dir),
    )
    trainer.train()
    trainer.save_model(options.output_dir)
