"""``threadweaver pgrpo``: P-GRPO with :class:`PGRPOTrainer`, as a command.

Its flags are the fields of :class:`PGRPOConfig` (the paper's settings by default), as TRL's
own command line parses its configs; :data:`DEFAULTS` are this command's own defaults where
they differ. The trained model is saved with its tokenizer in the plain transformers
layout, so transformers and vLLM load it without threadweaver.
"""

from __future__ import annotations

import os

from threadweaver.cli_args import SettingError, spellings
from threadweaver.hf_collator.sft import (
    check_paths,
    check_steps,
    checkpoint_help,
    quiet_tied_weights,
    recording_callbacks,
    resume_point,
    run_defaults,
    saving_as_asked,
    saying_how_to_go_on,
)
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
    checkpoint_help(parser)
    parser.set_defaults(**DEFAULTS, **run_defaults())
    return parser


def main(argv: list[str]) -> str:
    """Run the command; returns where the model was saved."""
    from threadweaver.trl_pgrpo import PGRPOConfig

    command = parser()
    values = vars(command.parse_args(argv))
    saving_as_asked(argv, values)
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
        if isinstance(prompt, str) and not prompt.strip():  # the rollouts would answer the chat template alone
            raise RowError(line, "field 'prompt' is empty")
        rows.append({"prompt": prompt, "answer": answer})
    if not rows:
        raise ValueError(f"{path}: no problems")
    return rows


def check_settings(config) -> None:
    """Refuse settings that would train nothing, or weight the rewards wrongly, before anything loads."""
    from threadweaver.trl_pgrpo import pgrpo_rewards

    check_steps(config)
    check_baseline(config)
    weights = config.reward_weights
    rewards = [reward.__name__ for reward in pgrpo_rewards(config.reward_config())]  # what PGRPOTrainer grades by
    if weights is not None and len(weights) != len(rewards):
        raise ValueError(
            f"--reward-weights takes {len(rewards)} weights, one per reward ({', '.join(rewards)}), "
            f"not {len(weights)}: {weights}"
        )
    if weights is not None and (negative := [r for r, w in zip(rewards, weights) if w < 0]):
        raise ValueError(
            f"--reward-weights must be at least 0, not {weights}: a negative weight on {', '.join(negative)} "
            "would train towards wrong or slower answers"
        )


def check_baseline(config) -> None:
    """Refuse an acceleration flag given with ``--no-branching``: the sequential baseline has no acceleration
    reward, so it would be ignored (a script's config may carry them for both arms; the command's flags are asked)."""
    from threadweaver.trl_pgrpo import PGRPOConfig

    if config.branching:
        return
    for name in ("acceleration_factor", "acceleration_clip", "acceleration_form"):
        value, default = getattr(config, name), PGRPOConfig.__dataclass_fields__[name].default
        if value != default and not (name == "acceleration_factor" and value == 0):
            raise ValueError(
                f"--{name.replace('_', '-')} is {value!r}, but branching is off: the sequential baseline has no "
                f"acceleration reward, so it would be ignored; leave it at {default!r}"
            )


def check_problem_count(path: str, rows: list[dict], config) -> None:
    """Refuse fewer problems than a step rolls out: TRL's sampler keeps only full batches of problems, so no
    batch would be drawn, and the Trainer would save the model untrained as if all went well."""
    per_step = config.per_device_train_batch_size // config.num_generations
    needed = config.generation_batch_size // config.num_generations
    if len(rows) >= needed:
        return
    takes = f"--prompts-per-step {per_step}"
    if needed != per_step:  # --gradient-accumulation-steps, --steps-per-generation or processes make the batch
        takes = (
            f"{needed}: a generation batch of {config.generation_batch_size} rollouts, "
            f"--num-generations {config.num_generations} a problem"
        )
    raise ValueError(
        f"{path} has {len(rows)} problem{'s' * (len(rows) != 1)}, fewer than a step rolls out ({takes}): "
        "nothing would be trained"
    )


RECORDED_SETTINGS = ("branching", "max_depth", "max_completion_length")
"""The settings that shape what ``pgrpo`` rolls out and trains on, kept in each checkpoint (``sft.RUN_RECORD``)."""


def train(model_dir: str, problems: str, config) -> str:
    """P-GRPO on the problems in ``problems`` with ``config`` (a ``PGRPOConfig``); returns the output directory."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from threadweaver.trl_pgrpo import PGRPOTrainer

    check_settings(config)
    check_paths(model_dir, problems, config.output_dir, "pgrpo")
    resume = resume_point(config)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = problem_rows(problems, RowReader(tokenizer))
    check_problem_count(problems, rows, config)
    # float32 weights, under autocast where --bf16 (as sft trains): AdamW's steps of about the learning rate
    # (the paper's 1e-6) round away on bf16 weights, so a bf16 policy would barely move
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    settings = {name: getattr(config, name) for name in RECORDED_SETTINGS}
    trainer = PGRPOTrainer(
        model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=recording_callbacks(config, resume, problems, settings, "PROBLEMS"),
    )
    with saying_how_to_go_on(config), quiet_tied_weights(model):
        trainer.train(resume_from_checkpoint=resume)
    model.set_attn_implementation("sdpa")
    trainer.save_model(config.output_dir)
    tokenizer.save_pretrained(config.output_dir)
    write_json(os.path.join(config.output_dir, "log_history.json"), trainer.state.log_history)
    return config.output_dir
