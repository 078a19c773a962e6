"""The trajectory format: tag vocabulary, token codecs and canonical tokenisation.

Everything downstream works on token ids. A :class:`Format` binds the tag ids of one
tokenizer to its encode/decode functions, and tokenises trajectory text exactly the
way the orchestrator assembles it at inference: tags as single tokens, the thread
seed ``<Thread>`` + ``"{i}:"`` tokenised on its own, and no tokens at the join points
(after ``</Outlines>`` and ``</Thread>``, before ``<Thread>`` and ``</Parallel>``),
where the orchestrator never generates any.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, fields
from functools import cached_property, lru_cache
from typing import Any, Protocol

KIT_TOKENIZERS = ("synth", "qwen")
"""The embedded tokenizers' names: every reader takes them for these, before a folder of that name (a row
that records ``synth`` is read with it, wherever it is read)."""

THINK, THINK_END = "<think>", "</think>"
PARALLEL, PARALLEL_END = "<Parallel>", "</Parallel>"
OUTLINES, OUTLINES_END = "<Outlines>", "</Outlines>"
OUTLINE, OUTLINE_END = "<Outline>", "</Outline>"
THREAD, THREAD_END = "<Thread>", "</Thread>"

TAGS: tuple[str, ...] = (
    THINK,
    THINK_END,
    PARALLEL,
    PARALLEL_END,
    OUTLINES,
    OUTLINES_END,
    OUTLINE,
    OUTLINE_END,
    THREAD,
    THREAD_END,
)
"""Every tag of the format, each a single token in a prepared tokenizer."""

EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
"""The tokens that end a generation, where the tokenizer has them (the orchestrator stops on them)."""

_TAG_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in TAGS) + ")")
_NUMBER = re.compile(r"\s*(0|[1-9][0-9]*)\s*:")
"""The ``n:`` that starts an outline and a thread's seed, as the orchestrator writes it: ASCII digits, no
leading zero (``01:`` or ``١:`` is text that the parse judges, not a number the encoder rewrites)."""
_JOIN_BEFORE = (OUTLINES_END, THREAD_END)
_JOIN_AFTER = (THREAD, PARALLEL_END)


def block_text(outlines: Sequence[str], threads: Sequence[str], lead: str = "") -> str:
    """A parallel block as text: ``<Parallel>{lead}<Outlines><Outline>1:...</Outline>...</Outlines>``,
    then ``<Thread>1:...</Thread>...`` and ``</Parallel>``: numbered as the orchestrator seeds a
    thread (``k:``, then the text), nothing between the tags."""
    return (
        PARALLEL
        + lead
        + OUTLINES
        + "".join(f"{OUTLINE}{k}:{text}{OUTLINE_END}" for k, text in enumerate(outlines, 1))
        + OUTLINES_END
        + "".join(f"{THREAD}{k}:{text}{THREAD_END}" for k, text in enumerate(threads, 1))
        + PARALLEL_END
    )


class Codec(Protocol):
    """Text <-> token ids, with tags and special tokens kept as they are."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class TagIds:
    """Token ids of the tags in one tokenizer."""

    think: int
    think_end: int
    parallel: int
    parallel_end: int
    outlines: int
    outlines_end: int
    outline: int
    outline_end: int
    thread: int
    thread_end: int

    @classmethod
    def from_lookup(cls, lookup) -> TagIds:
        """Build from ``lookup(tag) -> id | None``; names every missing tag."""
        ids = {f.name: lookup(tag) for f, tag in zip(fields(cls), TAGS)}
        missing = [tag for f, tag in zip(fields(cls), TAGS) if ids[f.name] is None]
        if missing:
            raise ValueError(
                f"the tokenizer has no single token for {', '.join(missing)}; "
                "call threadweaver.format.add_tags(tokenizer, model) first"
            )
        return cls(**ids)

    @cached_property
    def structural(self) -> frozenset[int]:
        """The tags that make up blocks (all but ``<think>`` and ``</think>``)."""
        return frozenset(astuple(self)[2:])

    def name(self, token_id: int) -> str | None:
        for f, tag in zip(fields(self), TAGS):
            if getattr(self, f.name) == token_id:
                return tag
        return None


class _HFCodec:
    """A transformers tokenizer (slow or fast)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


class _TokenizersCodec:
    """A raw ``tokenizers.Tokenizer``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


class Format:
    """The ThreadWeaver format for one tokenizer.

    ``eos_ids`` are the tokens that end a generation (``<|im_end|>``, ``<|endoftext|>``):
    inside a thread they are malformed.
    """

    def __init__(
        self,
        codec: Codec,
        tags: TagIds,
        eos_ids: Iterable[int] = (),
        unk_id: int | None = None,
        tokenizer_name: str | None = None,
    ):
        self.codec = codec
        self.tokenizer_name = tokenizer_name
        """What loads the tokenizer back (``synth``, ``qwen``, a directory or hub id), where it says:
        the rows written with this format record it (:data:`threadweaver.rows.TOKENIZER_FIELD`)."""
        self.tags = tags
        self.eos_ids = frozenset(eos_ids)
        self.unk_id = unk_id
        self._tag_by_text = {tag: getattr(tags, f.name) for f, tag in zip(fields(TagIds), TAGS)}
        self.seed = lru_cache(maxsize=None)(self._seed)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, eos_tokens: Iterable[str] = EOS_TOKENS) -> Format:
        """Wrap a transformers tokenizer or a ``tokenizers.Tokenizer`` (duck-typed)."""
        if hasattr(tokenizer, "convert_tokens_to_ids"):
            codec: Codec = _HFCodec(tokenizer)
            vocab = tokenizer.get_vocab()
        elif hasattr(tokenizer, "token_to_id"):
            codec = _TokenizersCodec(tokenizer)
            vocab = tokenizer.get_vocab(with_added_tokens=True)
        else:
            raise TypeError(f"not a tokenizer: {type(tokenizer).__name__}")
        tags = TagIds.from_lookup(vocab.get)
        eos = [vocab[t] for t in eos_tokens if t in vocab]
        unk = getattr(tokenizer, "unk_token", None) or ("<unk>" if hasattr(tokenizer, "token_to_id") else None)
        name = getattr(tokenizer, "name_or_path", None) or None
        if name is not None and name not in KIT_TOKENIZERS and os.path.isdir(name):
            name = os.path.abspath(name)
        return cls(codec, tags, eos, vocab.get(unk) if unk else None, name)

    def tag_name(self, token_id: int) -> str | None:
        return self.tags.name(token_id)

    def _seed(self, number: int) -> tuple[int, ...]:
        """Tokens the orchestrator injects after ``<Thread>`` for thread ``number``."""
        return tuple(self.codec.encode(f"{number}:"))

    def decode(self, ids: Sequence[int]) -> str:
        return self.codec.decode(ids)

    def outline_number(self, ids: Sequence[int]) -> int | None:
        """The ``n`` of an outline body ``"n: ..."``, or None."""
        match = _NUMBER.match(self.codec.decode(ids))
        return int(match.group(1)) if match else None

    def encode(self, text: str) -> list[int]:
        """Tokenise trajectory text the way the orchestrator assembles it.

        Whitespace-only text at a join point is dropped and whitespace around a thread
        number is removed, since the orchestrator injects exactly ``<Thread>`` + ``"i:"``
        there. Anything else is kept; :func:`threadweaver.tree.parse` judges it.
        """
        pieces = [p for p in _TAG_SPLIT.split(text) if p]
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            if piece in self._tag_by_text:
                ids.append(self._tag_by_text[piece])
                continue
            before = pieces[k - 1] if k else None
            after = pieces[k + 1] if k + 1 < len(pieces) else None
            if before in _JOIN_BEFORE and after in _JOIN_AFTER and piece.isspace():
                continue
            if before == THREAD:
                match = _NUMBER.match(piece)
                if match:
                    ids.extend(self.seed(int(match.group(1))))
                    piece = piece[match.end() :]
                    if not piece:
                        continue
            ids.extend(self._encode_known(piece))
        return ids

    def _encode_known(self, text: str) -> list[int]:
        ids = self.codec.encode(text)
        if self.unk_id is not None and self.unk_id in ids:
            bad = sorted({c for c in text if self.unk_id in self.codec.encode(c)})
            raise ValueError(f"the tokenizer cannot represent {bad!r} (in {text[:60]!r})")
        return ids


TAG_INITS = ("spelling", "mean")
"""How :func:`add_tags` initialises the embedding rows of new tags: ``spelling`` (the default), the mean
row of the tokens that spelled the tag before it was added (``<``, ``Parallel``, ``>``); ``mean``, the
mean row of the tokens the model had (every tag starts alike). ``bench/prepare_init.py`` measured both
on SmolLM2-135M-Instruct (tied embeddings, ``bench/RESULTS.md``): the held-out loss on the tag tokens
started at 8.3 with ``spelling`` against 18.1 with ``mean``; after 40 fine-tuning steps the model
predicted every tag with ``spelling`` (loss 0.05) and none with ``mean`` (loss 7.4)."""


def split_tags(tokenizer: Any) -> dict[str, list[int]]:
    """The tags ``tokenizer`` does not encode as a single token of their own, each with the ids it gives.

    A tag passes where it is one token alone and inside text (``a<Parallel>b`` has its id). Empty: every
    tag is ready for :meth:`Format.from_tokenizer`, the collator and the orchestrator.
    """
    vocab = tokenizer.get_vocab()
    split = {}
    for tag in TAGS:
        ids = list(tokenizer.encode(tag, add_special_tokens=False))
        tag_id = vocab.get(tag)
        if tag_id is None or ids != [tag_id] or tag_id not in tokenizer.encode(f"a{tag}b", add_special_tokens=False):
            split[tag] = ids
    return split


def missing_tags(tokenizer: Any) -> str | None:
    """What ``tokenizer`` lacks to read and write the format, in words ("tokenizer has no single token for
    <Parallel>, ..."), or None where every tag is one token (:func:`split_tags`). ``threadweaver prepare``
    adds them."""
    split = split_tags(tokenizer)
    return f"tokenizer has no single token for {', '.join(split)}" if split else None


def add_tags(tokenizer: Any, model: Any = None, init: str = "spelling") -> list[int]:
    """Add the tags to a transformers tokenizer as single tokens; prepare ``model``.

    The tags are added as non-special added tokens (like Qwen3's own ``<think>``), so
    they are never split and ``decode`` keeps them even with ``skip_special_tokens``
    (vLLM's default). A tag the vocabulary has but the tokenizer splits is registered
    at the id it has. Returns the ids of the tags that were not single tokens before.
    If ``model`` is given, its embedding matrix grows to cover the tokenizer, and the
    rows of the tags with new ids (and of an untied output layer) are initialised as
    ``init`` says (:data:`TAG_INITS`); existing rows are left as they are.
    """
    from tokenizers import AddedToken

    if init not in TAG_INITS:
        raise ValueError(f"init must be one of {', '.join(TAG_INITS)}, not {init!r}")
    if not hasattr(tokenizer, "convert_tokens_to_ids"):  # a tokenizers.Tokenizer's encode gives no ids
        raise TypeError(f"add_tags needs a transformers tokenizer, not {type(tokenizer).__name__}")
    spellings = split_tags(tokenizer)
    old_size = len(tokenizer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in spellings])
    added = {t: tokenizer.convert_tokens_to_ids(t) for t in spellings}
    if model is not None:
        rows = {tag_id: spellings[t] for t, tag_id in added.items() if tag_id >= old_size}
        _init_new_rows(model, len(tokenizer), old_size, rows, init)
    return list(added.values())


def _init_new_rows(model, vocab_size: int, old_size: int, rows: dict[int, list[int]], init: str) -> None:
    """Grow ``model``'s embeddings to ``vocab_size`` rows if they are fewer; set the ``rows`` (new id:
    the ids that spelled it) in the input matrix and in an untied output matrix."""
    import torch

    if model.get_input_embeddings().weight.shape[0] < vocab_size:
        model.resize_token_embeddings(vocab_size, mean_resizing=False)
    if not rows:
        return
    matrices = [model.get_input_embeddings().weight]
    output = model.get_output_embeddings()
    if output is not None and output.weight.data_ptr() != matrices[0].data_ptr():
        matrices.append(output.weight)
    with torch.no_grad():
        for weight in matrices:
            mean = weight[:old_size].mean(dim=0)
            for new_id, spelling in rows.items():
                row = mean if init == "mean" or not spelling else weight[spelling].mean(dim=0)
                weight[new_id] = row.to(weight.dtype)
