"""Dataset rows into token ids: the one reader of prompts and trajectories.

Rows come in TRL's dataset shapes, or as token ids:

* ``prompt_ids`` with ``completion_ids`` or ``token_ids`` (what ``threadweaver generate``
  writes): used as they are;
* ``messages``: a conversation; the prompt is the chat template over the turns before the
  trailing assistant turns, with the generation prompt; the trajectory is the last turn,
  which must be the assistant's;
* ``prompt`` (+ ``completion``): messages (as ``messages``), or a string. A string beside a
  completion is the prompt text itself (TRL's prompt-completion format); a string alone
  is a question: one user turn through the chat template (the text itself when the
  tokenizer has no template). A completion is a string or messages with an assistant turn;
* ``text``: a conversation rendered with the chat template, split after its last
  generation prompt; text without one is all trajectory (``generate``'s ``text``).

No special tokens are added to any text: a chat template writes its own. Trajectory text
goes through :meth:`threadweaver.format.Format.encode`, the orchestrator's tokenisation.
A malformed row raises ``ValueError`` naming the field at fault (:class:`~threadweaver.jsonl.FieldError`
where its shape is at fault).
"""

from __future__ import annotations

import re
from typing import Any

from threadweaver.cli_args import is_whole
from threadweaver.format import Format
from threadweaver.jsonl import FieldError, RowError, prefixed, read_jsonl

FIELDS = ("prompt_ids", "completion_ids", "token_ids", "messages", "prompt", "completion", "text")
"""Every field a row is read from; the rest of a row is its own business."""
TOKENIZER_FIELD = "tokenizer"
"""What every command that writes rows records in each: the tokenizer it used
(:attr:`threadweaver.format.Format.tokenizer_name`); the commands that read rows load it by default."""


def recorded_tokenizer(path: str) -> tuple[int, str | None]:
    """(the line of the first row of a JSONL file, the tokenizer it records); None: it records none, or cannot
    be read here (the reader that follows names what is wrong with it). A field that is not a name raises
    :class:`RowError`: read with the wrong tokenizer, the rows would be misread without a word."""
    try:
        line, row = next(read_jsonl(path), (0, {}))
    except (ValueError, OSError):
        return 0, None
    name = row.get(TOKENIZER_FIELD)
    if name is not None and not (isinstance(name, str) and name):
        why = f"field {TOKENIZER_FIELD!r}: must name the tokenizer the row was written with, not {name!r}"
        raise RowError(line, why, shape=True)
    return line, name


def tokenizer_field(fmt: Format) -> dict:
    """``{"tokenizer": name}`` for a row written with ``fmt``; nothing where the tokenizer has no name."""
    return {} if fmt.tokenizer_name is None else {TOKENIZER_FIELD: fmt.tokenizer_name}


def chatml_turns(text: str) -> list[dict]:
    """The turns of a conversation rendered in ChatML (``<|im_start|>role\n...<|im_end|>``, as
    Qwen's templates write it), in order; the last may be unterminated."""
    return [
        {"role": m.group(1), "content": m.group(2)}
        for m in re.finditer(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|\Z)", text, re.S)
    ]


def chat_prompt_ids(
    tokenizer: Any, messages: list[dict], *, add_special_tokens: bool = False, **template_kwargs
) -> list[int]:
    """``messages`` through the chat template, with the generation prompt, as token ids (the rendered text's
    own: special tokens are added only if asked, as vLLM's chat requests ask)."""
    return plain_ids(tokenizer, chat_prompt_text(tokenizer, messages, **template_kwargs), add_special_tokens)


def chat_prompt_text(tokenizer: Any, messages: list[dict], **template_kwargs) -> str:
    """``messages`` through the chat template, with the generation prompt. A conversation the template cannot
    render (a turn without the ``content`` it reads, a role it refuses) raises
    :class:`~threadweaver.jsonl.FieldError` with the template's own words."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("a conversation needs a tokenizer with a chat template (this one has none)")
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)
    except Exception as err:  # jinja2's, which transformers renders templates with (not a dependency here)
        if not type(err).__module__.startswith("jinja2"):
            raise
        if type(err).__name__ == "TemplateSyntaxError":  # the tokenizer's fault, not the row's
            raise ValueError(f"the tokenizer's chat template does not compile: {err}") from None
        raise FieldError(f"the chat template cannot render this conversation: {err}") from None
    return text


def plain_ids(tokenizer: Any, text: str, add_special_tokens: bool = False) -> list[int]:
    """Text as it is, with no special tokens added unless asked (a transformers or a raw ``tokenizers``
    tokenizer)."""
    encoded = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return list(getattr(encoded, "ids", encoded))


class RowReader:
    """Reads rows for one tokenizer; ``template_kwargs`` go to its chat template."""

    def __init__(self, tokenizer: Any, fmt: Format | None = None, **template_kwargs):
        self.tokenizer = tokenizer
        self._fmt = fmt
        self.template_kwargs = template_kwargs
        self._generation_prompt: str | None = None

    @property
    def fmt(self) -> Format:
        """The format of the tokenizer (needed for trajectories only)."""
        if self._fmt is None:
            self._fmt = Format.from_tokenizer(self.tokenizer)
        return self._fmt

    def prompt(self, row: dict) -> list[int]:
        if "prompt_ids" in row:
            return _ids(row, "prompt_ids", _vocabulary_size(self.tokenizer), allow_empty=False)
        if "messages" in row or isinstance(row.get("prompt"), list):
            field = "messages" if "messages" in row else "prompt"
            messages = prompt_messages(row[field], field)
            try:
                return self.chat(messages)
            except ValueError as err:
                raise prefixed(f"field {field!r}", err) from None
        if "prompt" in row:
            prompt = row["prompt"]
            if not isinstance(prompt, str):
                raise FieldError("field 'prompt' must be a string or a list of messages")
            if "completion" in row or not getattr(self.tokenizer, "chat_template", None):
                return plain_ids(self.tokenizer, prompt)
            return self.chat([{"role": "user", "content": prompt}])
        if "text" in row:
            return self._split_text(row)[0]
        raise FieldError("no prompt: expected 'messages', 'prompt', 'text' or 'prompt_ids'")

    def trajectory(self, row: dict, end_of_turn: int | None = None) -> list[int]:
        """The trajectory's ids; ``end_of_turn`` is appended to a trajectory given as text."""
        for field in ("completion_ids", "token_ids"):
            if field in row:
                return _ids(row, field, _ID_LIMIT)
        if "messages" in row:
            messages = _messages(row["messages"], "messages")
            if not messages or messages[-1]["role"] != "assistant":
                raise FieldError("field 'messages' must end with an assistant turn (the trajectory)")
            text = messages[-1].get("content")
        elif "completion" in row:
            text = _completion_text(row["completion"])
        elif "text" in row:
            text = self._split_text(row)[1]
        else:
            raise FieldError(
                "no trajectory: expected 'messages', 'completion', 'text', 'completion_ids' or 'token_ids'"
            )
        if not isinstance(text, str):
            raise FieldError("the assistant content must be a string")
        return self.fmt.encode(text) + ([] if end_of_turn is None else [end_of_turn])

    def chat(self, messages: list[dict]) -> list[int]:
        return chat_prompt_ids(self.tokenizer, messages, **self.template_kwargs)

    def _split_text(self, row: dict) -> tuple[list[int], str]:
        """A ``text`` row: (prompt ids, trajectory text)."""
        text = row["text"]
        if not isinstance(text, str):
            raise FieldError("field 'text' must be a string")
        marker = self.generation_prompt()
        head, found, trajectory = text.rpartition(marker) if marker else ("", "", text)
        if not found:
            return [], text
        trajectory = trajectory.rstrip()
        for end in self.fmt.eos_ids:  # the rendered turn's end-of-turn token
            trajectory = trajectory.removesuffix(self.fmt.decode([end]))
        return plain_ids(self.tokenizer, head + marker), trajectory

    def generation_prompt(self) -> str | None:
        """What the chat template appends for ``add_generation_prompt=True`` (None: no template)."""
        if self._generation_prompt is None and getattr(self.tokenizer, "chat_template", None):
            turn = [{"role": "user", "content": "x"}]
            bare = self.tokenizer.apply_chat_template(turn, tokenize=False)
            full = self.tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
            if not full.startswith(bare) or full == bare:
                raise ValueError("the chat template has no separable generation prompt; use 'messages' rows")
            self._generation_prompt = full[len(bare) :]
        return self._generation_prompt


def prompt_messages(messages, field: str = "messages") -> list[dict]:
    """The turns of a conversation before its trailing assistant turns (the prompt it asks for)."""
    messages = _messages(messages, field)
    while messages and messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    if not messages:
        raise FieldError(f"field {field!r} has no turn before the assistant's")
    return messages


_ID_LIMIT = 2**31
"""Past every model's vocabulary, and past what a tokenizer's decode takes without overflowing. A
sampled id may lie past the tokenizer's length, in the model's padded vocabulary (Qwen3: 151,669
tokens, 151,936 rows), so a trajectory is held only to this; a prompt, to the tokenizer's length."""


def _ids(row: dict, field: str, limit: int | None, allow_empty: bool = True) -> list[int]:
    """The token ids in ``row[field]``, each in ``0..limit-1`` (None: not negative)."""
    ids = row[field]
    if not isinstance(ids, list) or not all(is_whole(t) for t in ids) or not (ids or allow_empty):
        raise FieldError(f"field {field!r} must be a {'' if allow_empty else 'non-empty '}list of token ids")
    for position, token in enumerate(ids):
        if token < 0:
            raise FieldError(f"field {field!r} holds token id {token} at position {position}: ids are not negative")
        if limit is not None and token >= limit:
            where = f"token id {token} at position {position}"
            raise ValueError(f"field {field!r} holds {where}, outside the vocabulary (0..{limit - 1})")
    return ids


def _vocabulary_size(tokenizer: Any) -> int | None:
    """How many token ids a transformers or a raw ``tokenizers`` tokenizer has, added ones included
    (None: not a tokenizer that says)."""
    if hasattr(tokenizer, "__len__"):
        return len(tokenizer)
    if hasattr(tokenizer, "get_vocab_size"):
        return tokenizer.get_vocab_size(with_added_tokens=True)
    return None


def _messages(messages, field: str) -> list[dict]:
    def turn(m) -> bool:
        return isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str)

    if not isinstance(messages, list) or not all(map(turn, messages)):
        raise FieldError(f"field {field!r} must be a list of {{role, content}} turns with string values")
    return messages


def _completion_text(completion) -> str:
    if isinstance(completion, list):
        for message in completion:
            if isinstance(message, dict) and message.get("role") == "assistant":
                return message.get("content")
        raise FieldError("field 'completion' has no assistant message")
    return completion
