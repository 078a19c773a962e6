"""Trie SFT inside your own TRL script: the collator plus one attention setting.

python examples/sft_trl.py MODEL_DIR TRAIN.jsonl [OUTPUT_DIR] [MAX_STEPS]
"""

import sys

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from threadweaver.hf_collator import TrieCollator  # registers the threadweaver_* attention

model_dir, data, out = sys.argv[1], sys.argv[2], (sys.argv[3:] or ["runs/sft_example"])[0]
gpu = torch.cuda.is_available()
tokenizer = AutoTokenizer.from_pretrained(model_dir)
attention = "threadweaver_flex" if gpu else "threadweaver_sdpa"
model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attention)
trainer = SFTTrainer(
    model=model,
    processing_class=tokenizer,
    train_dataset=load_dataset("json", data_files=data, split="train"),
    data_collator=TrieCollator(tokenizer),
    args=SFTConfig(
        output_dir=out,
        max_steps=int((sys.argv[4:] or [300])[0]),
        learning_rate=3e-3,
        use_cpu=not gpu,
        bf16=gpu,
        report_to="none",
        remove_unused_columns=False,
        dataset_kwargs={"skip_prepare_dataset": True},
    ),
)
trainer.train()
trainer.save_model(out)
