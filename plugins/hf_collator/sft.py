"""``threadweaver sft``: trie SFT with TRL's SFTTrainer, as a command.

The model is trained with tree attention (or, with ``--sequential``, as plain causal
sequences) and saved with its tokenizer in the plain transformers layout, so
transformers and vLLM load it without threadweaver.
"""

from __future__ import annotations

import logging
import os

from tqdm import tqdm

from threadweaver.hf_collator.attention import use_tree_attention
from threadweaver.hf_collator.collator import TrieCollator
from threadweaver.report import read_jsonl
from threadweaver.sft_args import SFTArgs

logger = logging.getLogger(__name__)


def load_rows(path: str, collator: TrieCollator) -> list[dict]:
    """Every row of ``path``, checked by flattening it once; a bad row names its line.

    With ``collator.skip_malformed`` bad rows are dropped and counted instead.
    """
    rows = []
    for line, row in tqdm(read_jsonl(path), desc="checking rows", unit=" rows"):
        name = f"{line}" + (f" (id {row['id']})" if "id" in row else "")
        if collator.flatten_or_skip(row, name) is not None:
            rows.append({**row, "_row": name})
    if collator.skipped:
        logger.warning("skipped %d malformed rows of %s", collator.skipped, path)
    if not rows:
        raise ValueError(f"{path}: no trainable rows")
    return rows


def train(args: SFTArgs) -> str:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from threadweaver.format import add_tags

    cuda = torch.cuda.is_available()
    attention = args.attention if args.attention != "auto" else ("flex_attention" if cuda else "sdpa")
    if attention == "flex_attention" and not cuda:
        raise ValueError("FlexAttention has no backward pass on CPU; train with --attention sdpa")
    dtype = args.dtype
    if dtype == "auto":
        dtype = "bfloat16" if cuda and torch.cuda.is_bf16_supported() else "float32"

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation=attention)
    if add_tags(tokenizer, model):
        logger.warning("added the ThreadWeaver tags to the tokenizer and the embeddings")
    if not args.sequential:
        use_tree_attention(model)

    collator = TrieCollator(
        tokenizer,
        max_length=args.max_length,
        sequential=args.sequential,
        skip_malformed=args.skip_malformed,
        row_key="_row",
    )
    rows = load_rows(args.data, collator)
    config = SFTConfig(
        output_dir=args.output_dir,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type=args.lr_scheduler,
        warmup_steps=args.warmup,
        weight_decay=args.weight_decay,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        gradient_checkpointing=args.gradient_checkpointing,
        bf16=dtype == "bfloat16",
        use_cpu=not cuda,
        logging_steps=args.logging_steps,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        remove_unused_columns=False,
        dataset_kwargs={"skip_prepare_dataset": True},
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        data_collator=collator,
    )
    trainer.train()
    if collator.skipped:
        logger.warning("%d malformed rows skipped in all", collator.skipped)
    model.set_attn_implementation("sdpa")
    trainer.save_model(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    trainer.state.save_to_json(os.path.join(args.output_dir, "trainer_state.json"))
    return args.output_dir
