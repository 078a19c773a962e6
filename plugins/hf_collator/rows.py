"""Dataset rows -> (prompt ids, trajectory ids), in the shapes TRL's SFTTrainer accepts.

* ``messages``: a conversation whose last turn is the assistant's trajectory; the prompt
  is the chat template over the turns before it, with the generation prompt;
* ``prompt`` + ``completion``: strings (the prompt is used verbatim) or message lists;
* ``text``: a conversation already rendered with the chat template; the trajectory is
  what follows the last generation prompt (``<|im_start|>assistant\\n`` for ChatML);
* ``prompt_ids`` + ``completion_ids``: token ids, used as they are.

Text trajectories go through :meth:`threadweaver.format.Format.encode` (tags as single
tokens, the seeds exactly as the orchestrator injects them) and end with the
tokenizer's end-of-turn token, which the model must learn to write.
"""

from __future__ import annotations

from typing import Any

from threadweaver.format import Format


class RowFormatError(ValueError):
    """A row that cannot be trained on; the message names the row (and token position)."""

    def __init__(self, row: str, message: str, position: int | None = None):
        super().__init__(f"row {row}: {message}")
        self.row = row
        self.position = position


class RowEncoder:
    def __init__(self, tokenizer: Any, fmt: Format | None = None):
        self.tokenizer = tokenizer
        self.fmt = fmt or Format.from_tokenizer(tokenizer)
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no eos_token: set it to the end-of-turn token (e.g. <|im_end|>)")
        self.end_of_turn = eos
        self._generation_prompt: str | None = None

    def __call__(self, row: dict) -> tuple[list[int], list[int]]:
        """(prompt ids, trajectory ids); raises ``ValueError`` naming the field at fault."""
        if "prompt_ids" in row or "completion_ids" in row:
            return _ids(row, "prompt_ids"), _ids(row, "completion_ids")
        if "messages" in row:
            messages = row["messages"]
            if not isinstance(messages, list) or not messages or not _is_assistant(messages[-1]):
                raise ValueError("field 'messages' must end with an assistant turn (the trajectory)")
            return self._chat_prompt(messages[:-1]), self._trajectory(messages[-1]["content"])
        if "completion" in row:
            return self._prompt(row.get("prompt")), self._trajectory(_completion_text(row["completion"]))
        if "text" in row:
            return self._split_rendered(row["text"])
        raise ValueError(
            "no trajectory: expected 'messages', 'prompt' + 'completion', 'text' or 'prompt_ids' + 'completion_ids'"
        )

    def _prompt(self, prompt) -> list[int]:
        if isinstance(prompt, list):
            return self._chat_prompt(prompt)
        if not isinstance(prompt, str):
            raise ValueError("field 'prompt' must be a string or a list of messages")
        return self._encode_plain(prompt)

    def _chat_prompt(self, messages: list) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self._encode_plain(text)

    def _encode_plain(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _trajectory(self, text) -> list[int]:
        if not isinstance(text, str):
            raise ValueError("the assistant content must be a string")
        return self.fmt.encode(text) + [self.end_of_turn]

    def _split_rendered(self, text) -> tuple[list[int], list[int]]:
        if not isinstance(text, str):
            raise ValueError("field 'text' must be a string")
        marker = self.generation_prompt()
        head, found, trajectory = text.rpartition(marker)
        if not found:
            raise ValueError(f"field 'text' has no generation prompt {marker!r} to split prompt from trajectory")
        end = self.tokenizer.convert_ids_to_tokens(self.end_of_turn)
        trajectory = trajectory.rstrip()
        if trajectory.endswith(end):
            trajectory = trajectory[: -len(end)]
        return self._encode_plain(head + marker), self._trajectory(trajectory)

    def generation_prompt(self) -> str:
        """What the chat template appends for ``add_generation_prompt=True``."""
        if self._generation_prompt is None:
            turn = [{"role": "user", "content": "x"}]
            bare = self.tokenizer.apply_chat_template(turn, tokenize=False)
            full = self.tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
            if not full.startswith(bare) or full == bare:
                raise ValueError("the chat template has no separable generation prompt; use 'messages' rows")
            self._generation_prompt = full[len(bare) :]
        return self._generation_prompt


def _ids(row: dict, field: str) -> list[int]:
    ids = row.get(field)
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise ValueError(f"field {field!r} must be a list of integers")
    return ids


def _is_assistant(message) -> bool:
    return isinstance(message, dict) and message.get("role") == "assistant"


def _completion_text(completion) -> str:
    if isinstance(completion, list):
        for message in completion:
            if _is_assistant(message):
                return message.get("content")
        raise ValueError("field 'completion' has no assistant message")
    return completion
