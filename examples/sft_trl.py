"""Trie SFT inside your own TRL script: the collator plus one attention setting.

python examples/sft_trl.py MODEL_DIR TRAIN.jsonl [--output-dir DIR] [--max-steps N] [--learning-rate LR]
"""

import argparse

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from threadweaver.hf_collator import TrieCollator, check_tree_attention  # registers the threadweaver_* attention

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("model_dir", help="a model whose tokenizer has the tags (`threadweaver prepare` writes one)")
parser.add_argument("data", help="JSONL training rows (see threadweaver.rows)")
parser.add_argument("--output-dir", default="runs/sft_example")
parser.add_argument("--max-steps", type=int, default=300)
parser.add_argument(
    "--learning-rate", type=float, default=1e-4, help="1e-4 for a pretrained model; the embedded 1M kit took 1e-3"
)
parser.add_argument("--max-length", type=int, default=8192, help="rows are cut to this many tokens")
options = parser.parse_args()

gpu = torch.cuda.is_available()
tokenizer = AutoTokenizer.from_pretrained(options.model_dir)
attention = "threadweaver_flex" if gpu else "threadweaver_sdpa"
# float32 weights, under autocast with bf16 (as `threadweaver sft` trains): a bf16 checkpoint's own dtype would
# round small AdamW steps away
model = AutoModelForCausalLM.from_pretrained(options.model_dir, dtype=torch.float32, attn_implementation=attention)
check_tree_attention(model)
trainer = SFTTrainer(
    model=model,
    processing_class=tokenizer,
    train_dataset=load_dataset("json", data_files=options.data, split="train"),
    data_collator=TrieCollator(tokenizer, max_length=options.max_length),
    args=SFTConfig(
        output_dir=options.output_dir,
        max_steps=options.max_steps,
        learning_rate=options.learning_rate,
        use_cpu=not gpu,
        bf16=gpu,
        report_to="none",
        remove_unused_columns=False,
        dataset_kwargs={"skip_prepare_dataset": True},
    ),
)
trainer.train()
trainer.save_model(options.output_dir)
