"""Turn an engine's answer into a :class:`Completion`, whatever the engine's habits."""

from __future__ import annotations

from typing import Sequence

from threadweaver.orchestrator import Completion

from .http import EngineError


def to_completion(token_ids: Sequence[int], finish_reason: str | None, matched, stop_ids: Sequence[int],
                  logprobs: Sequence[float] | None = None, cached_tokens: int | None = None, *,
                  where: str) -> Completion:
    """``matched``: the stop token (or string) the engine reports, if any.

    vLLM and SGLang keep a matched stop token id at the end of the ids; should one
    ever drop it, it is put back, so a ``"stop"`` completion always ends with it.
    """
    ids = list(token_ids)
    if finish_reason == "stop" and isinstance(matched, int) and matched in stop_ids and (not ids or ids[-1] != matched):
        ids.append(matched)
    if finish_reason in ("stop", "length"):
        return Completion(tuple(ids), finish_reason, None if logprobs is None else tuple(logprobs), cached_tokens)
    raise EngineError(f"{where}: the request finished with {finish_reason!r} (matched {matched!r}) "
                      "instead of 'stop' or 'length'")
