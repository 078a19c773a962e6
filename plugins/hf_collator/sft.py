"""``threadweaver sft``: trie SFT with TRL's SFTTrainer, as a command.

Its flags are the fields of TRL's ``SFTConfig`` and of :class:`TrieCollator`, as TRL's own
command line parses its configs; :data:`DEFAULTS` are this command's own defaults where
they differ from TRL's. The model is trained with tree attention (with ``--no-branching``,
as plain causal sequences) and saved with its tokenizer in the plain transformers layout,
so transformers and vLLM load it without threadweaver.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import logging
import numbers
import os
import re
import types

from threadweaver.cli_args import (
    SettingError,
    add_arguments,
    check_counts,
    check_numbers,
    given,
    is_finite,
    is_number,
    spellings,
)
from threadweaver.format import missing_tags
from threadweaver.hf_collator.attention import flash_attention_4_missing, use_tree_attention
from threadweaver.hf_collator.collator import RowFormatError, TrieCollator
from threadweaver.hf_collator.malloc import keep_freed_memory
from threadweaver.jsonl import RowError, check_writable, file_digest, not_a_file_of_rows, read_jsonl, write_json
from threadweaver.progress import progress_bar
from threadweaver.rows import FIELDS
from threadweaver.trie import IGNORE_INDEX

logger = logging.getLogger(__name__)


def run_defaults() -> dict:
    """What the training commands (``sft``, ``pgrpo``) set over TRL's defaults alike: a seeded run that saves
    only its final model, logs to no tracker unless asked, and runs on the GPU where there is one (in bf16
    where it has it), else on the CPU."""
    import torch

    cuda = torch.cuda.is_available()
    bf16 = cuda and torch.cuda.is_bf16_supported()
    return {"seed": 0, "save_strategy": "no", "report_to": "none", "use_cpu": not cuda, "bf16": bf16}


DEFAULTS = {
    "output_dir": os.path.join("runs", "sft"),
    "learning_rate": 1e-4,
    "lr_scheduler_type": "cosine",
    "per_device_train_batch_size": 8,
    "max_length": 8192,
    "logging_steps": 10,
}
SHARED_WITH_CONFIG = ("max_length", "pad_to_multiple_of", "padding_free")
"""Collator settings that ``SFTConfig`` declares already: the collator takes them from it.

TRL refuses a custom collator with its own ``padding_free``, so the collator packs instead."""
NOT_FLAGS = ("tokenizer", "row_key", "vocab_size", *SHARED_WITH_CONFIG)
COLLATOR_FLAGS = tuple(f.name for f in dataclasses.fields(TrieCollator) if f.init and f.name not in NOT_FLAGS)
ATTENTION = ("auto", "sdpa", "eager", "flex_attention", "varlen")
DENSE_MASK = ("sdpa", "eager")
"""Tree attention over an N x N mask: packing rows makes it cost the square of the batch's tokens."""
FLEX_BACKENDS = ("AUTO", "TRITON", "FLASH")
"""FlexAttention's kernel backends (torch's ``BACKEND`` kernel option)."""
NEEDS_CUDA = ("flex_attention", "varlen")
"""FlexAttention has no CPU backward; varlen runs flash's kernel (a slow reference elsewhere)."""


def parser():
    """The command's parser (imports TRL, so it is built only when the command runs)."""
    from transformers import HfArgumentParser
    from trl import SFTConfig

    parser = HfArgumentParser(
        SFTConfig, prog="threadweaver sft", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("model", help="Model directory or hub id (a causal LM in transformers format).")
    parser.add_argument(
        "data",
        help="JSONL rows in any shape threadweaver.rows reads (messages, prompt + "
        "completion, text, prompt_ids + completion_ids or token_ids).",
    )
    parser.add_argument(
        "--attention",
        default="auto",
        choices=ATTENTION,
        help="Tree attention backend ('auto': flex_attention on GPU, sdpa on CPU; varlen: flash's "
        "variable-length kernel, GPU only).",
    )
    parser.add_argument(
        *spellings("flex_backend"),
        default="AUTO",
        choices=FLEX_BACKENDS,
        help="FlexAttention's kernels for --attention flex_attention (torch's BACKEND kernel option). FLASH is "
        "FlashAttention 4 (pip install flash-attn-4; Hopper or Blackwell), over the whole trie: with each "
        "decoder layer compiled it ran 1.59x causal flash's speed at 32k tokens on an H200, where the "
        "default ran 1.18x (bench/RESULTS.md).",
    )
    add_arguments(parser, TrieCollator, include=COLLATOR_FLAGS)
    shared = {f.name: f.metadata["help"] for f in dataclasses.fields(TrieCollator) if f.name in SHARED_WITH_CONFIG}
    for action in parser._actions:  # what the flag does here, not what TRL's own collator would do
        if action.dest in shared:
            action.help = shared[action.dest]
    checkpoint_help(parser)
    parser.set_defaults(**DEFAULTS, **run_defaults())
    return parser


def saving_as_asked(argv: list[str], values: dict) -> None:
    """``--save-steps N`` without ``--save-strategy`` saves a checkpoint each N steps, as in TRL, whose default
    strategy is "steps" (the training commands' own default, the final model only, once ignored it). Refused:
    ``--save-steps`` with another strategy (:func:`check_trainer_numbers` refuses a count no checkpoint comes of)."""
    if not given(argv, "--save_steps"):
        return
    if not given(argv, "--save_strategy"):
        values["save_strategy"] = "steps"
    elif values["save_strategy"] != "steps":
        strategy = values["save_strategy"]
        raise ValueError(f"--save-steps goes with --save-strategy steps (or alone), not {strategy}: leave one out")


def checkpoint_help(parser) -> None:
    """``--save-strategy``'s and ``--resume-from-checkpoint``'s help as the training commands read them (the
    default differs from TRL's, and transformers' says that a script of one's own reads the checkpoint)."""
    for action in parser._actions:
        if action.dest == "save_strategy":
            action.help = (
                "When to save a checkpoint: 'no' (the final model only), 'steps' (each --save-steps; --save-steps "
                "alone sets it), 'epoch' or 'best'."
            )
        if action.dest == "resume_from_checkpoint":
            action.help = (
                "A checkpoint-N folder to go on from, or 'last' for the newest whole one in --output-dir (a run "
                "saves them with --save-steps N)."
            )


def parsed_flags(argv: list[str]) -> dict:
    """The command's flags as values, with what it refuses before anything loads refused, named by flag
    (``self-train`` checks its ``sft`` flags so, before it samples)."""
    values = vars(parser().parse_args(argv))
    saving_as_asked(argv, values)
    try:
        check_trainer_numbers(types.SimpleNamespace(**values))  # SFTConfig refuses some in words that name no flag
    except SettingError as err:  # named as TRL's flags are
        raise ValueError(err.by_flags()) from None
    return values


def main(argv: list[str]) -> str:
    """Run the command; returns where the model was saved."""
    from trl import SFTConfig

    values = parsed_flags(argv)
    model, data, attention = values.pop("model"), values.pop("data"), values.pop("attention")
    flex_backend = values.pop("flex_backend")
    collator = {name: values.pop(name) for name in COLLATOR_FLAGS}
    try:
        return train(model, data, SFTConfig(**values), attention, flex_backend, **collator)
    except SettingError as err:  # named as TRL's flags are
        raise ValueError(err.by_flags()) from None
    except RowFormatError as err:  # load_rows names a row by its line
        raise ValueError(f"{data}: line {err.row}: {err.detail} (--skip-malformed skips such rows)") from None
    except RowError as err:
        raise ValueError(f"{data}: {err}") from None


def load_rows(path: str, collator: TrieCollator, max_positions: int | None = None) -> list[dict]:
    """Every row of ``path``, checked by flattening it once; a bad row names its line.

    With ``collator.skip_malformed`` bad rows are dropped and counted instead. ``max_positions``: the positions
    the model was made for (:func:`position_limit`); rows that reach past them (as --max-length cuts them) are
    refused.
    """
    rows, cut, untrained, longest, past, first_past = [], 0, 0, 0, 0, None
    for line, row in progress_bar(read_jsonl(path), desc="checking rows", unit=" rows"):
        name = f"{line}" + (f" (id {row['id']})" if "id" in row else "")
        if (flat := collator.flatten_or_skip(row, name)) is not None:
            rows.append({**{field: row[field] for field in FIELDS if field in row}, "_row": name})
            cut += flat.cut > 0
            untrained += flat.cut > 0 and all(label == IGNORE_INDEX for label in flat.labels)
            longest = max(longest, len(flat.input_ids) + flat.cut)
            reach = max(flat.position_ids, default=-1) + 1  # positions the row takes
            if max_positions is not None and reach > max_positions:
                past += 1
                first_past = first_past or (line, reach)
    if past:
        raise ValueError(
            f"{path}: {past} of {len(rows)} rows reach past the {max_positions} positions the model was made for "
            f"(its max_position_embeddings), the first at line {first_past[0]} ({first_past[1]} positions). "
            f"--max-length {max_positions} cuts them there; to train on them whole, raise max_position_embeddings "
            "(with RoPE scaling) in the model's config.json"
        )
    if collator.skipped:
        logger.warning("skipped %d malformed rows of %s", collator.skipped, path)
    if not rows:
        raise ValueError(f"{path}: no trainable rows")
    if untrained == len(rows):
        raise ValueError(
            f"{path}: --max-length {collator.max_length} cuts every row inside its prompt, so no row has a "
            f"trajectory token left to train (the longest row is {longest} tokens)"
        )
    if cut:
        logger.warning(
            "--max-length %d cuts %d of %d rows of %s (the longest is %d tokens): their later tokens are not trained%s",
            collator.max_length,
            cut,
            len(rows),
            path,
            longest,
            f", and {untrained} of them keep no trajectory token at all" if untrained else "",
        )
    return rows


def position_limit(config) -> int | None:
    """The positions a model was made for (``max_position_embeddings``), or None where it says none, or where
    its RoPE is scaled past them (YaRN, say: the scaling is how a model reaches further), for any layer type."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    by_layer_type = rope.values() if all(isinstance(value, dict) for value in rope.values()) and rope else [rope]
    if any(kind.get("rope_type", kind.get("type", "default")) != "default" for kind in by_layer_type):
        return None
    return getattr(config, "max_position_embeddings", None)


def _table(rows: list[dict]):
    """The rows as a datasets table with every field any row has (``Dataset.from_list`` keeps the
    first row's only); a row lacks nothing it had, and gets None for the fields it had not."""
    from datasets import Dataset

    columns = list(dict.fromkeys(key for row in rows for key in row))
    return Dataset.from_dict({key: [row.get(key) for row in rows] for key in columns})


def check_prepared(model_dir: str, tokenizer, model=None) -> None:
    """Refuse a model whose tokenizer splits a tag or whose embeddings do not cover the tokenizer: adding
    tags is `threadweaver prepare`'s job (the same :func:`threadweaver.format.add_tags`, and a chat
    template that renders ``<think>``), not something training does on the side."""
    missing = missing_tags(tokenizer)
    rows = len(tokenizer) if model is None else model.get_input_embeddings().weight.shape[0]
    if missing or rows < len(tokenizer):
        what = (
            f"its {missing}"
            if missing
            else f"its embeddings have {rows} rows, fewer than its tokenizer's {len(tokenizer)} tokens"
        )
        raise ValueError(
            f"{model_dir}: {what}; run `threadweaver prepare {model_dir} DIR` first (it adds the tags, sizes "
            "the embeddings and checks the chat template), then train DIR"
        )


def check_row_tokenizer(data: str, model_dir: str, tokenizer) -> None:
    """Refuse rows of token ids written with a tokenizer whose vocabulary is not MODEL's: their ids would
    train other tokens, without a word. The tokenizer the first row records is compared where it loads
    here (the kit's names, a local folder or file; a hub id is not fetched for this); rows of text are
    tokenised with MODEL's, so any tokenizer wrote them."""
    from threadweaver.jsonl import read_jsonl
    from threadweaver.kit.tokenizers import load_tokenizer
    from threadweaver.rows import TOKENIZER_FIELD

    try:
        _, row = next(read_jsonl(data), (0, {}))
    except (ValueError, OSError):
        return  # load_rows names what is wrong with the file
    name = row.get(TOKENIZER_FIELD)
    if not isinstance(name, str) or not any(field in row for field in ("prompt_ids", "completion_ids", "token_ids")):
        return
    if name not in ("synth", "qwen") and not os.path.exists(os.path.expanduser(name)):
        return
    try:
        written_with = load_tokenizer(os.path.expanduser(name)).get_vocab()
    except (OSError, ValueError):
        return
    if written_with != tokenizer.get_vocab():
        raise ValueError(
            f"{data}: its rows are token ids of the tokenizer {name!r} (field {TOKENIZER_FIELD!r}), whose vocabulary "
            f"is not {model_dir}'s: their ids would train other tokens. Train the model that tokenizer belongs to, "
            "or rows of text (messages)"
        )


def check_trainer_numbers(config) -> None:
    """Refuse, naming the field (:class:`SettingError`), what torch and the Trainer refuse only once the model
    has loaded (no gradient accumulation: a ``ZeroDivisionError``; a seed numpy cannot take; workers below 0),
    and what ``TrainingArguments`` refuses without naming its flag (a negative ``warmup_steps``) or with a traceback
    (an infinite ``save_steps``: ``OverflowError``)."""
    check_counts(config, ("per_device_train_batch_size", "gradient_accumulation_steps"))
    check_counts(config, ("dataloader_num_workers",), least=0)
    check_numbers(config, ("learning_rate", "warmup_steps", "logging_steps"))
    steps = config.save_steps
    if config.save_strategy != "steps":  # not read: TRL takes any
        check_numbers(config, ("save_steps",))
    elif not (is_number(steps) and is_finite(steps) and steps > 0 and (steps < 1 or steps == int(steps))):
        raise SettingError(
            "save_steps", f"must be a whole number of steps, or a share of the run's under 1, not {steps!r}"
        )
    if config.eval_steps is not None:
        check_numbers(config, ("eval_steps",))
    for name in ("seed", "data_seed"):
        value = getattr(config, name)
        whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)  # a numpy int is one too
        if value is not None and not (whole and 0 <= value < 2**32):
            raise SettingError(name, f"must be a whole number from 0 to 2**32 - 1, not {value!r}")


def check_steps(config) -> None:
    """Refuse a run of no step: the Trainer saved the model untrained and said nothing."""
    if config.max_steps == 0:  # transformers reads 0 as 0 steps, below 0 as "train --num-train-epochs epochs"
        raise ValueError("--max-steps is 0: nothing would be trained")
    if config.max_steps < 0 and config.num_train_epochs <= 0:
        raise ValueError(
            f"--max-steps is {config.max_steps} (train by epochs) and --num-train-epochs is "
            f"{config.num_train_epochs}: nothing would be trained"
        )


def check_paths(model_dir: str, data: str, output_dir: str, command: str = "sft") -> None:
    """Refuse, before anything loads, a MODEL, DATA or --output-dir that cannot be one (the two swapped,
    say, or a folder no file can be written in), and an --output-dir that is MODEL: training would overwrite the
    model it starts from."""
    from threadweaver.model_dirs import check_model_dir

    check_model_dir(model_dir, what=f"a model directory ({command} takes MODEL, then DATA)")
    if problem := not_a_file_of_rows(data):
        raise ValueError(f"{data}: {problem}")
    if not output_dir:
        raise ValueError("--output-dir is empty: name the folder to save the model in")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"--output-dir {output_dir}: a file, not a folder")
    if os.path.isdir(output_dir) and os.path.isdir(model_dir) and os.path.samefile(output_dir, model_dir):
        raise ValueError(f"--output-dir {output_dir} is MODEL: saving there would overwrite it; name another folder")
    try:
        check_writable(os.path.join(output_dir, TRAINER_STATE))  # /proc/x failed only once training began
    except ValueError as err:
        raise ValueError(f"--output-dir {output_dir}: {err}") from None


RESUME_LAST = ("true", "last")
"""``--resume-from-checkpoint`` values that mean the newest ``checkpoint-N`` folder in ``--output-dir``."""


def resume_point(config) -> str | None:
    """The checkpoint this run goes on from (None: it starts anew), checked before anything loads.

    transformers' ``Trainer`` leaves ``--resume-from-checkpoint`` to the script that runs it (``train()`` reads an
    argument instead), so without this it was taken and ignored: the run trained from the first step. A run that
    starts anew refuses an ``--output-dir`` that holds an earlier run (:func:`check_no_earlier_run`)."""
    given = config.resume_from_checkpoint
    if given is None:
        check_no_earlier_run(config.output_dir)
        return None
    if given.lower() in RESUME_LAST:
        whole, torn = checkpoints(config.output_dir)
        if not whole:
            cut = f"; {', '.join(torn)}: cut short as saved (no {TRAINER_STATE})" if torn else ""
            raise ValueError(
                f"--resume-from-checkpoint {given}: no whole checkpoint-N folder in --output-dir "
                f"{config.output_dir}{cut} (a run saves them with --save-steps N)"
            )
        if torn and _number(torn[-1]) > _number(whole[-1]):
            logger.warning(
                "%s was cut short as it was saved (it has no %s): going on from %s", torn[-1], TRAINER_STATE, whole[-1]
            )
        given = os.path.join(config.output_dir, whole[-1])
    elif not os.path.isfile(os.path.join(given, TRAINER_STATE)):
        raise ValueError(
            f"--resume-from-checkpoint {given}: not a whole checkpoint (a checkpoint-N folder with {TRAINER_STATE}; "
            f"'last' takes the newest in --output-dir)"
        )
    check_steps_left(given, config)
    return given


TRAINER_STATE = "trainer_state.json"
"""What the Trainer writes last into a checkpoint: a checkpoint without it was cut short as it was saved."""


def checkpoints(output_dir: str) -> tuple[list[str], list[str]]:
    """(the whole ``checkpoint-N`` folders in ``output_dir``, those cut short as they were saved), oldest first."""
    if not os.path.isdir(output_dir):
        return [], []
    names = sorted((n for n in os.listdir(output_dir) if _CHECKPOINT.fullmatch(n)), key=_number)
    whole = [n for n in names if os.path.isfile(os.path.join(output_dir, n, TRAINER_STATE))]
    return whole, [n for n in names if n not in whole]


_CHECKPOINT = re.compile(r"checkpoint-\d+")


def _number(checkpoint: str) -> int:
    return int(checkpoint.rpartition("-")[2])


def check_no_earlier_run(output_dir: str) -> None:
    """Refuse an ``--output-dir`` that holds an earlier run (its saved model or checkpoints) for a run that starts
    anew: the Trainer would write over the model, and with ``--save-total-limit`` delete the earlier checkpoints."""
    if not os.path.isdir(output_dir):
        return
    names = os.listdir(output_dir)
    whole, torn = checkpoints(output_dir)
    saved = [n for n in names if n in (TRAINER_STATE, "config.json") or n.endswith((".safetensors", ".bin"))]
    if not (whole or torn or saved):
        return
    held = ", ".join([*(["a saved model"] if saved else []), *[*whole, *torn][-3:]])
    go_on = "--resume-from-checkpoint last goes on from its newest checkpoint; " if whole else ""
    raise ValueError(
        f"--output-dir {output_dir} holds an earlier run ({held}): a run that starts anew would write over it; "
        f"{go_on}to start anew, name another folder or remove that one"
    )


def check_steps_left(checkpoint: str, config) -> None:
    """Refuse a resumed run with no step left to train: the Trainer trained none and said nothing."""
    try:
        with open(os.path.join(checkpoint, TRAINER_STATE)) as f:
            step = json.load(f)["global_step"]
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"--resume-from-checkpoint {checkpoint}: cannot read its {TRAINER_STATE} ({err})") from None
    if 0 < config.max_steps < step:  # at --max-steps: a run stopped as it saved the model, which is saved now
        raise ValueError(
            f"--resume-from-checkpoint {checkpoint}: it is at step {step}, past --max-steps {config.max_steps}: "
            "no step is left to train; raise --max-steps"
        )


RUN_RECORD = "threadweaver_run.json"
"""Written into each checkpoint: the rows it was trained on (DATA's path and digest) and the settings that shape them
(:data:`RECORDED_SETTINGS`). A run that goes on from it with others says so; the Trainer takes them without a word."""
RECORDED_SETTINGS = ("branching", "train_injected", "max_depth", "max_length")
"""The collator's settings that shape what ``sft`` trains."""


def run_record(data: str, settings: dict, data_name: str = "DATA") -> dict:
    """What a run trains on, as :data:`RUN_RECORD` keeps it: the file of rows it names ``data_name`` (its digest
    where it is a file: a pipe was read once, by the run), and ``settings``."""
    digest = file_digest(data) if os.path.isfile(data) else None
    return {"data": os.path.abspath(data), "data_name": data_name, "data_sha256": digest, "settings": settings}


def recording_callbacks(config, resume: str | None, data: str, settings: dict, data_name: str = "DATA") -> list:
    """The Trainer callbacks that keep a run of ``config`` on ``data`` with ``settings`` in each checkpoint it saves
    (:func:`recording_run`), once it has said what changed since ``resume``, the checkpoint it goes on from
    (:func:`say_what_changed`). A run that neither saves checkpoints nor goes on from one does not read its rows
    twice to digest them."""
    if resume is None and config.save_strategy == "no":
        return []
    record = run_record(data, settings, data_name)
    if resume and config.should_log:  # said once, not by each process of a distributed run
        say_what_changed(resume, record)
    return [recording_run(record)]


def recording_run(record: dict):
    """A ``TrainerCallback`` that writes ``record`` into each checkpoint the run saves, once the Trainer has saved it
    whole (a run killed in between leaves a checkpoint without one, which a resumed run takes without a word)."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class RecordRun(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            if args.should_save and os.path.isdir(folder):  # the process that saved it (one a node, or one in all)
                try:
                    write_json(os.path.join(folder, RUN_RECORD), record)
                except OSError as err:  # the checkpoint is saved: training goes on without its record
                    logger.warning("cannot write %s into %s: %s", RUN_RECORD, folder, err.strerror or err)

    return RecordRun()


def say_what_changed(checkpoint: str, record: dict) -> None:
    """Warn where a run goes on from ``checkpoint`` with other rows or settings than those it was trained on."""
    path = os.path.join(checkpoint, RUN_RECORD)
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > 2**20:  # a record is a few hundred bytes
            return
        with open(path) as f:
            earlier = json.load(f)
        earlier_data, earlier_digest, earlier_settings = (
            earlier["data"],
            earlier["data_sha256"],
            dict(earlier["settings"]),
        )
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return  # saved by another script, or by a threadweaver that kept no record, or torn
    if not (isinstance(earlier_data, str) and earlier_data.isprintable()):
        return  # not a record of ours
    changes = []
    if None not in (earlier_digest, record["data_sha256"]) and earlier_digest != record["data_sha256"]:
        data, name = record["data"], record["data_name"]
        changes.append(
            f"{name} {data}, whose rows changed since"
            if data == earlier_data
            else f"{name} {data}, where it was trained on {earlier_data}"
        )
    for name, value in record["settings"].items():
        if name in earlier_settings and earlier_settings[name] != value:
            changes.append(f"{_as_flag(name, value)}, where it had {_as_flag(name, earlier_settings[name])}")
    if changes:
        logger.warning(
            "going on from %s with %s: the Trainer takes them as they are, and skips as many batches as the "
            "checkpoint had trained; to train on them from the first step, start anew in another --output-dir",
            checkpoint,
            "; ".join(changes),
        )


def _as_flag(name: str, value) -> str:
    """A setting as the command line spells it: ``--branching``, ``--no-branching``, ``--max-depth 3`` (``max_length
    None``, which only Python can set, as Python spells it)."""
    flag = f"--{name.replace('_', '-')}"
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    return f"{name} None" if value is None else f"{flag} {value}"


MISSING_KEYS = "There were missing keys in the checkpoint model loaded: "
"""transformers' warning on resuming a model whose tied weights (``lm_head.weight``, tied to the embedding) the
checkpoint does not save: loading the weight they are tied to restores them, so for those it says nothing amiss."""


@contextlib.contextmanager
def quiet_tied_weights(model):
    """Drop :data:`MISSING_KEYS` where every key it names is a weight of ``model`` tied to another."""
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}

    def keep(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(MISSING_KEYS):
            return True
        try:
            keys = ast.literal_eval(message.removeprefix(MISSING_KEYS).rstrip("."))
        except (ValueError, SyntaxError):
            return True
        return not (isinstance(keys, list) and set(keys) <= tied)

    trainer_logger = logging.getLogger("transformers.trainer")
    trainer_logger.addFilter(keep)
    try:
        yield
    finally:
        trainer_logger.removeFilter(keep)


@contextlib.contextmanager
def saying_how_to_go_on(config):
    """A run of ``config`` (a ``TrainingArguments``) stopped (Ctrl-C, SIGTERM): its message says how to go on from
    the checkpoint it saved, or from the one it went on from, or that it kept no step."""
    from threadweaver.interrupts import Stopped

    output_dir = config.output_dir
    earlier, _ = checkpoints(output_dir)  # a run it resumes saved those: they are not what this one kept
    try:
        yield
    except KeyboardInterrupt as interrupt:
        whole, _ = checkpoints(output_dir)
        saved = [c for c in whole if c not in earlier]
        if saved:
            kept = os.path.join(output_dir, saved[-1])
            message = f"stopped; {kept} is kept: rerun with --resume-from-checkpoint last to go on"
        elif earlier:
            start = os.path.join(output_dir, earlier[-1])
            message = f"stopped before it saved a checkpoint; {start}, which it went on from, is kept: rerun to go on"
        else:
            how = "" if config.save_strategy != "no" else " (with --save-steps N, a stopped run goes on from its last)"
            message = f"stopped before it saved a checkpoint: none of its steps is kept{how}"
        raise Stopped(message, interrupt) from None


IGNORED_TRL_SETTINGS = (
    ("truncation_mode", ("keep_start",), "the collator keeps each row's first --max-length tokens in pre-order"),
    ("completion_only_loss", (None, True), "the collator trains the trajectory only, never the prompt"),
    ("assistant_only_loss", (False,), "the collator trains the trajectory, the last assistant turn, only"),
    (
        "dataset_text_field",
        ("text",),
        "the collator reads a row's messages, prompt and completion, token ids, or rendered chat in 'text' "
        "(threadweaver.rows): name the field 'text'",
    ),
    ("dataset_num_proc", (None,), "the collator tokenises each batch as it builds it, and TRL prepares nothing"),
)
"""SFTConfig settings the collator does not apply (TRL's own tokenising would), with the values it honours."""


def _refuse_ignored(config) -> None:
    for name, honoured, why in IGNORED_TRL_SETTINGS:
        value = getattr(config, name)
        if value not in honoured:
            raise ValueError(f"--{name.replace('_', '-')} {value} is not applied here: {why}")


def train(
    model_dir: str, data: str, config, attention: str = "auto", flex_backend: str = "AUTO", **collator_settings
) -> str:
    """Fine-tune ``model_dir`` on ``data`` with ``config`` (an ``SFTConfig``); returns the output directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    if config.max_length is not None and config.max_length < 1:
        raise ValueError(f"--max-length must be a whole number of at least 1, not {config.max_length}")
    check_trainer_numbers(config)
    # the collator takes a max_depth of 0, which refuses every parallel row
    check_counts(types.SimpleNamespace(max_depth=collator_settings.get("max_depth", 1)), ("max_depth",))
    check_steps(config)
    if config.packing:
        raise ValueError(
            "--packing concatenates and cuts token sequences, which would cut the trajectories' trees: "
            "--padding-free true packs a batch's rows whole, each its own tree"
        )
    _refuse_ignored(config)
    cuda = torch.cuda.is_available()
    attention = attention if attention != "auto" else ("flex_attention" if cuda else "sdpa")
    if flex_backend != "AUTO" and (attention != "flex_attention" or not collator_settings.get("branching", True)):
        raise ValueError(
            f"--flex-backend {flex_backend} picks FlexAttention's kernels for trie rows: "
            "use --attention flex_attention, with branching"
        )
    if attention in NEEDS_CUDA and not cuda:
        raise ValueError(f"--attention {attention} trains on a GPU only; on CPU train with --attention sdpa")
    if flex_backend == "FLASH" and not (config.bf16 or config.fp16):
        raise ValueError(
            "--flex-backend FLASH: FlashAttention 4 runs in bf16 or fp16, not float32: train with --bf16 true "
            "(the default on a GPU that has bf16) or --fp16 true"
        )
    if flex_backend == "FLASH" and (missing := flash_attention_4_missing()):
        raise ValueError(f"--flex-backend FLASH: {missing}")
    check_paths(model_dir, data, config.output_dir)  # after the flags' refusals, which read flags only
    resume = resume_point(config)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    check_prepared(model_dir, tokenizer)
    check_row_tokenizer(data, model_dir, tokenizer)
    base = "sdpa" if attention == "varlen" else attention  # varlen is a tree attention only
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=base)
    check_prepared(model_dir, tokenizer, model)
    collator = TrieCollator(
        tokenizer,
        **{name: getattr(config, name) for name in SHARED_WITH_CONFIG},
        **collator_settings,
        row_key="_row",
        vocab_size=model.get_input_embeddings().weight.shape[0],
    )
    if collator.branching:
        use_tree_attention(model, attention, {"BACKEND": flex_backend} if flex_backend != "AUTO" else None)
    if collator.padding_free and (attention if collator.branching else base) in DENSE_MASK:
        logger.warning(
            "--padding-free with --attention %s: a dense mask over the whole packed row costs the square of the "
            "batch's tokens, not of each row's; padded batches train faster with it (bench/RESULTS.md). Pack on "
            "a GPU, with flex_attention (or varlen, for trie rows), which skip what the mask hides",
            attention,
        )
    rows = load_rows(data, collator, position_limit(model.config))
    # The collator does the tokenising (and the packing): TRL must keep every column and prepare nothing.
    config.padding_free = False
    config.remove_unused_columns = False
    config.dataset_kwargs = {**(config.dataset_kwargs or {}), "skip_prepare_dataset": True}
    settings = {name: getattr(collator, name) for name in RECORDED_SETTINGS}
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=_table(rows),
        processing_class=tokenizer,
        data_collator=collator,
        callbacks=recording_callbacks(config, resume, data, settings),
    )
    with (
        keep_freed_memory() if not cuda else contextlib.nullcontext(),
        saying_how_to_go_on(config),
        quiet_tied_weights(model),
    ):
        trainer.train(resume_from_checkpoint=resume)
    if collator.skipped:
        logger.warning("%d malformed rows skipped in all", collator.skipped)
    model.set_attn_implementation("sdpa")
    trainer.save_model(config.output_dir)
    tokenizer.save_pretrained(config.output_dir)
    trainer.state.save_to_json(os.path.join(config.output_dir, TRAINER_STATE))
    return config.output_dir
