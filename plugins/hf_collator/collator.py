"""A data collator that flattens each ThreadWeaver trajectory into a token trie.

``SFTTrainer(..., data_collator=TrieCollator(tokenizer))`` with a model loaded with
``attn_implementation="threadweaver_sdpa"`` (or ``_flex`` on GPU) trains every
(context, completion) request the orchestrator issues for a row, each shared prefix
once, in one row of the batch. The batch is:

* ``input_ids``, ``labels`` (trajectory tokens only; ordinary causal-LM labels, since the
  trie puts every trained token right after its parent), ``position_ids`` (trie depth),
  ``attention_mask`` (1 on real tokens, for the trainers' token counts);
* ``subtree_end``: the O(N) tree metadata the attention hook turns into the mask on the
  model's device. No N x N tensor is built on the host.

With ``branching=False`` rows are plain causal sequences (prompt + trajectory, the tags
as ordinary tokens): the paper's sequential baseline, for any attention implementation.

With ``padding_free=True`` the batch is one row: the rows one after another, each its own tree,
so no compute is spent on padding. Set it here, not on ``SFTConfig`` (TRL refuses a custom
collator with its own ``padding_free``).
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass, field
from typing import Any

import torch

from threadweaver.cli_args import check_counts, option
from threadweaver.rows import RowReader
from threadweaver.tree import DEFAULT_MAX_DEPTH, TrajectoryFormatError, parse
from threadweaver.trie import IGNORE_INDEX, trajectory_trie

logger = logging.getLogger(__name__)


class RowFormatError(ValueError):
    """A row that cannot be trained on; the message names the row (and token position)."""

    def __init__(self, row: str, message: str, position: int | None = None):
        super().__init__(f"row {row}: {message}")
        self.row, self.detail, self.position = row, message, position


@dataclass
class FlatRow:
    input_ids: list[int]
    labels: list[int]
    position_ids: list[int]
    subtree_end: list[int] | None
    """None for a plain causal row."""
    cut: int = 0
    """Tokens cut off at ``max_length``."""


@dataclass
class TrieCollator:
    tokenizer: Any = field(metadata={"help": "The model's tokenizer, with the ThreadWeaver tags as single tokens."})
    max_length: int | None = option(None, "Cut longer rows at a pre-order prefix (always ancestor-closed).")
    branching: bool = option(
        True,
        "Trie rows with tree attention; off: plain causal rows (prompt + trajectory, tags as "
        "ordinary tokens), the sequential baseline.",
    )
    skip_malformed: bool = option(False, "Skip (and log) rows that fail to parse instead of raising.")
    train_injected: bool = option(
        True,
        "Also train the orchestrator's injected tokens on the sequential path, so the model "
        "runs with branching off too.",
    )
    max_depth: int = option(DEFAULT_MAX_DEPTH, "Deepest nesting of parallel blocks accepted.")
    pad_to_multiple_of: int | None = option(None, "Pad the batch length to a multiple.")
    padding_free: bool = option(
        False,
        "Pack the batch's rows into one row, each its own tree (no padding, no token sees another "
        "row's); plain rows (branching off) restart their positions instead, as TRL's padding-free "
        "batches do.",
    )
    row_key: str = option("id", "Row field that names a row in errors and logs.")
    vocab_size: int | None = option(
        None,
        "The model's embedding rows: a row with a token id past them is refused, naming its position (default: "
        "unchecked; the embedding lookup fails mid-training instead).",
    )
    skipped: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        # a max_length of 0 would make empty batches, and a negative one would cut that many tokens off every row
        check_counts(self, ("max_length",), none_ok=True)
        self.reader = RowReader(self.tokenizer)
        self.fmt = self.reader.fmt
        self.end_of_turn = self.tokenizer.eos_token_id
        if self.end_of_turn is None:
            raise ValueError("the tokenizer has no eos_token: set it to the end-of-turn token (e.g. <|im_end|>)")
        pad = self.tokenizer.pad_token_id
        self.pad_id = self.end_of_turn if pad is None else pad

    def encode(self, row: dict) -> tuple[list[int], list[int]]:
        """(prompt ids, trajectory ids); a trajectory given as text ends with the end-of-turn token,
        which the model must learn to write (see :mod:`threadweaver.rows` for the row shapes)."""
        return self.reader.prompt(row), self.reader.trajectory(row, self.end_of_turn)

    def flatten(self, row: dict, name: str | None = None) -> FlatRow:
        """One row, flattened; raises :class:`RowFormatError` naming the row and position."""
        name = name if name is not None else str(row.get(self.row_key, "?"))
        # A datasets table gives every row every column of the file, None where the row had none.
        row = {key: value for key, value in row.items() if value is not None}
        try:
            prompt, trajectory = self.encode(row)
            if not prompt:
                raise ValueError("empty prompt: the first trajectory token has no context to be predicted from")
            self._check_vocabulary(prompt, trajectory)
            if not self.branching:
                return _plain(prompt, trajectory, self.max_length)
            tree = parse(trajectory, self.fmt, strict=True, max_depth=self.max_depth)
            flat = trajectory_trie(prompt, tree.nodes, self.fmt, train_injected=self.train_injected)
            whole = len(flat)
            if self.max_length is not None:
                flat = flat.truncate(self.max_length)
            return FlatRow(
                flat.input_ids, flat.labels(IGNORE_INDEX), flat.position_ids, flat.subtree_end, whole - len(flat)
            )
        except TrajectoryFormatError as err:
            raise RowFormatError(name, f"trajectory {err}", err.position) from None
        except ValueError as err:
            raise RowFormatError(name, str(err)) from None

    def flatten_or_skip(self, row: dict, name: str) -> FlatRow | None:
        """:meth:`flatten`, or with ``skip_malformed`` None for a bad row (logged and counted)."""
        try:
            return self.flatten(row, name)
        except RowFormatError as err:
            if not self.skip_malformed:
                raise
            self.skipped += 1
            logger.warning("skipped malformed %s (%d skipped so far)", err, self.skipped)
            return None

    def _check_vocabulary(self, prompt: list[int], trajectory: list[int]) -> None:
        if self.vocab_size is None:
            return
        for part, ids in (("prompt", prompt), ("trajectory", trajectory)):
            past = next((position for position, token in enumerate(ids) if token >= self.vocab_size), None)
            if past is not None:
                raise ValueError(
                    f"{part} token {past}: id {ids[past]} is past the model's {self.vocab_size} embedding rows"
                )

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        rows = []
        for k, row in enumerate(features):
            flat = self.flatten_or_skip(row, str(row[self.row_key]) if self.row_key in row else f"#{k} of the batch")
            if flat is not None:
                rows.append(flat)
        if not rows:
            raise RowFormatError(
                ", ".join(str(r.get(self.row_key, "?")) for r in features),
                f"every row of the batch is malformed ({self.skipped} skipped so far)",
            )
        return self.pack(rows) if self.padding_free else self.pad(rows)

    def pack(self, rows: list[FlatRow]) -> dict[str, torch.Tensor]:
        """The rows one after another in a single row, each row's subtree ends moved to where it starts.

        A row's root ends its subtree where the row ends, so no later token sees it. Plain rows carry
        no tree: their positions restart at 0 and no ``attention_mask`` is given, from which
        transformers (and flash's varlen kernels) find the sequences in a forward without a KV cache
        (``use_cache=False``, as TRL's trainers pass), as in TRL's padding-free batches.
        """
        start, ends = 0, []
        for row in rows:
            if row.subtree_end is not None:
                ends.extend(end + start for end in row.subtree_end)
            start += len(row.input_ids)
        packed = FlatRow(
            [token for row in rows for token in row.input_ids],
            [label for row in rows for label in row.labels],
            [position for row in rows for position in row.position_ids],
            ends if self.branching else None,
        )
        batch = self.pad([packed])
        if not self.branching:
            del batch["attention_mask"]
        return batch

    def pad(self, rows: list[FlatRow]) -> dict[str, torch.Tensor]:
        length = max(len(r.input_ids) for r in rows)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = {
            "input_ids": torch.full((len(rows), length), self.pad_id, dtype=torch.long),
            "labels": torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long),
            "position_ids": torch.zeros((len(rows), length), dtype=torch.long),
            "attention_mask": torch.zeros((len(rows), length), dtype=torch.long),
        }
        tree = self.branching
        if tree:
            # A padding token sees only itself and nobody sees it.
            batch["subtree_end"] = torch.arange(1, length + 1, dtype=torch.int32).repeat(len(rows), 1)
        for b, row in enumerate(rows):
            n = len(row.input_ids)
            batch["input_ids"][b, :n] = _tensor(row.input_ids)
            batch["labels"][b, :n] = _tensor(row.labels)
            batch["position_ids"][b, :n] = _tensor(row.position_ids)
            batch["attention_mask"][b, :n] = 1
            if tree:
                batch["subtree_end"][b, :n] = _tensor(row.subtree_end)
        return batch


def _tensor(values: list[int]) -> torch.Tensor:
    """int64 tensor from a list, through a typed buffer (several times faster than torch.tensor)."""
    return torch.frombuffer(array("q", values), dtype=torch.int64) if values else torch.zeros(0, dtype=torch.long)


def _plain(prompt: list[int], trajectory: list[int], max_length: int | None) -> FlatRow:
    ids = (prompt + trajectory)[:max_length]
    labels = ([IGNORE_INDEX] * len(prompt) + trajectory)[:max_length]
    return FlatRow(ids, labels, list(range(len(ids))), None, len(prompt) + len(trajectory) - len(ids))
