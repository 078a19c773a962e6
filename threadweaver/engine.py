"""What an engine is to the orchestrator: token ids in, a :class:`Completion` out.

Every engine (vLLM, SGLang, transformers, verl's server manager, a test script) turns
its own reply into a :class:`Completion` through :func:`to_completion`, so a stop
token, a finish reason and a failed request mean the same thing whichever engine ran.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from threadweaver.cli_args import SettingError, is_number, is_whole, option


@dataclass(frozen=True)
class Sampling:
    temperature: float = option(0.0, "0 is greedy.")
    top_p: float = option(1.0, "Nucleus sampling mass.")
    top_k: int = option(-1, "Keep the k most likely tokens (-1 or 0: all).")
    seed: int | None = option(None, "Sampling seed, where the engine takes one.")

    def __post_init__(self) -> None:
        # vLLM's ranges and types (the temperature's range is OpenAI's too), checked before any request: an
        # engine would refuse them only at a trajectory's first request, or (transformers) read a bad one as greedy
        if not (is_number(self.temperature) and 0 <= self.temperature <= 2):
            raise SettingError("temperature", f"must be between 0 and 2, not {self.temperature!r}")
        if not (is_number(self.top_p) and 0 < self.top_p <= 1):
            raise SettingError("top_p", f"must be more than 0 and at most 1, not {self.top_p!r}")
        if not (is_whole(self.top_k) and self.top_k >= -1):
            raise SettingError("top_k", f"must be -1 or 0 (every token) or at least 1, not {self.top_k!r}")
        if not (self.seed is None or is_whole(self.seed)):
            raise SettingError("seed", f"must be a whole number (or none), not {self.seed!r}")


@dataclass(frozen=True)
class Completion:
    token_ids: tuple[int, ...]
    """Generated tokens, including the stop token that ended them."""
    finish_reason: str
    """``"stop"`` (a stop token) or ``"length"`` (``max_tokens``)."""
    logprobs: tuple[float, ...] | None = None
    cached_tokens: int | None = None
    """Context tokens the engine served from its prefix cache, where it says."""
    first_token_s: float | None = None
    """Seconds from the request to its first token (queue and prefill), where the engine says."""


class Engine(Protocol):
    """Anything that continues token ids: vLLM, SGLang, transformers, a test script."""

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion: ...


class PinnedEngine(Engine, Protocol):
    """An engine over several servers: the orchestrator asks it once per trajectory for the engine
    that serves all of that trajectory's requests (one server, whose prefix cache then holds the
    prompt and the threads for the join)."""

    def pinned(self) -> Engine: ...


class StreamingEngine(Engine, Protocol):
    """An engine that can also hand over tokens as it generates them (for streamed replies)."""

    def stream(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> AsyncIterator[tuple[int, ...] | Completion]:
        """Yields runs of new token ids as they are generated, then the :class:`Completion`
        that :meth:`generate` would have returned."""
        ...


class EngineError(RuntimeError):
    """The engine could not serve a request; the message says why and what to check."""


class RequestRefused(EngineError):
    """The engine refused a request as invalid (a 4xx: a prompt over the model's context, say)."""


def to_completion(
    token_ids: Sequence[int],
    finish_reason: str | None,
    matched,
    stop_ids: Sequence[int],
    logprobs: Sequence[float] | None = None,
    cached_tokens: int | None = None,
    first_token_s: float | None = None,
    *,
    where: str,
) -> Completion:
    """An engine's reply as a :class:`Completion`; ``where`` names the engine in errors.

    ``matched``: the stop token (or string) the engine reports, if any. vLLM and SGLang
    keep a matched stop token id at the end of the ids; should one ever drop it, it is
    put back, so a ``"stop"`` completion always ends with it. ``finish_reason=None`` is an
    engine that finished without saying why (verl's server manager): a last token among
    ``stop_ids`` is a stop, anything else the length limit.
    """
    ids = list(token_ids)
    if finish_reason is None:
        finish_reason = "stop" if ids and ids[-1] in stop_ids else "length"
    if finish_reason == "stop" and isinstance(matched, int) and matched in stop_ids and (not ids or ids[-1] != matched):
        ids.append(matched)
    if finish_reason in ("stop", "length"):
        scores = None if logprobs is None else tuple(logprobs)
        return Completion(tuple(ids), finish_reason, scores, cached_tokens, first_token_s)
    if finish_reason == "abort":  # vLLM and SGLang abort what is running when they shut down
        raise EngineError(f"{where} aborted the request: it is shutting down, or gave up on the request (see its log)")
    raise EngineError(
        f"{where}: the request finished with {finish_reason!r} (matched {matched!r}) instead of 'stop' or 'length'"
    )
