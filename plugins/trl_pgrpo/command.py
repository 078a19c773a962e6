"""``threadweaver pgrpo``: P-GRPO with :class:`PGRPOTrainer`, as a command.

Its flags are the fields of :class:`PGRPOConfig` (the paper's settings by default), as TRL's
own command line parses its configs; :data:`DEFAULTS` are this command's own defaults where
they differ. The trained model is saved with its tokenizer in the plain transformers
layout, so transformers and vLLM load it without threadweaver.
"""

from __future__ import annotations

import os

from threadweaver.cli_args import SettingError, spellings
from threadweaver.hf_collator.sft import check_paths, resume_point, run_defaults
from threadweaver.jsonl import RowError, read_jsonl, write_json
from threadweaver.reward import row_answer
from threadweaver.rows import RowReader, prompt_messages

DEFAULTS = {
    "output_dir": os.path.join("runs", "pgrpo"),
    "max_steps": 100,
    "logging_steps": 1,
    "max_completion_length": 1024,
    "vllm_mode": "colocate",
}


def parser():
    """The command's parser (imports TRL, so it is built only when the command runs)."""
    from transformers import HfArgumentParser

    from threadweaver.trl_pgrpo import PGRPOConfig

    parser = HfArgumentParser(
        PGRPOConfig, prog="threadweaver pgrpo", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("model", help="The SFT'd ThreadWeaver model (directory or hub id).")
    parser.add_argument(
        "problems", help="JSONL problems: 'messages' or 'prompt' (see threadweaver.rows), and 'answer'."
    )
    parser.add_argument(
        *spellings("prompts_per_step"),
        type=int,
        default=1,
        help="Problems per step, each rolled out --num-generations times.",
    )
    parser.set_defaults(**DEFAULTS, **run_defaults())
    return parser


def main(argv: list[str]) -> str:
    """Run the command; returns where the model was saved."""
    from threadweaver.trl_pgrpo import PGRPOConfig

    command = parser()
    values = vars(command.parse_args(argv))
    model, problems, prompts = values.pop("model"), values.pop("problems"), values.pop("prompts_per_step")
    if values["per_device_train_batch_size"] != command.get_default("per_device_train_batch_size"):
        raise ValueError(
            "the batch is --prompts-per-step x --num-generations rollouts; "
            "set those instead of --per-device-train-batch-size"
        )
    if prompts < 1:
        raise ValueError(f"--prompts-per-step must be a whole number of at least 1, not {prompts}")
    values["per_device_train_batch_size"] = prompts * values["num_generations"]
    try:
        config = PGRPOConfig(**values)
    except SettingError as err:  # named as TRL's flags are
        raise ValueError(err.by_flags()) from None
    try:
        return train(model, problems, config)
    except RowError as err:
        raise ValueError(f"{problems}: {err}") from None


def problem_rows(path: str, reader: RowReader) -> list[dict]:
    """``{prompt, answer}`` rows for TRL; a row without a prompt or an answer names its line."""
    rows = []
    for line, row in read_jsonl(path):
        answer = row_answer(row, line)
        if "messages" not in row and "prompt" not in row:
            raise RowError(line, "no prompt: expected 'messages' or 'prompt'")
        try:
            prompt = prompt_messages(row["messages"]) if "messages" in row else row["prompt"]
            reader.prompt({"prompt": prompt})
        except ValueError as err:
            raise RowError.at(line, err) from None
        rows.append({"prompt": prompt, "answer": answer})
    if not rows:
        raise ValueError(f"{path}: no problems")
    return rows


def train(model_dir: str, problems: str, config) -> str:
    """P-GRPO on the problems in ``problems`` with ``config`` (a ``PGRPOConfig``); returns the output directory."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from threadweaver.trl_pgrpo import PGRPOTrainer

    check_paths(model_dir, problems, config.output_dir, "pgrpo")
    resume = resume_point(config)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = problem_rows(problems, RowReader(tokenizer))
    # float32 weights, under autocast where --bf16 (as sft trains): AdamW's steps of about the learning rate
    # (the paper's 1e-6) round away on bf16 weights, so a bf16 policy would barely move
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    trainer = PGRPOTrainer(model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=resume)
    model.set_attn_implementation("sdpa")
    trainer.save_model(config.output_dir)
    tokenizer.save_pretrained(config.output_dir)
    write_json(os.path.join(config.output_dir, "log_history.json"), trainer.state.log_history)
    return config.output_dir
