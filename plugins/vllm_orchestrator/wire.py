"""Turn an engine's answer into a :class:`Completion`, whatever the engine's habits."""

from __future__ import annotations

from collections.abc import Sequence

from threadweaver.orchestrator import Completion, Sampling

from .http import EngineError


def to_completion(
    token_ids: Sequence[int],
    finish_reason: str | None,
    matched,
    stop_ids: Sequence[int],
    logprobs: Sequence[float] | None = None,
    cached_tokens: int | None = None,
    *,
    where: str,
) -> Completion:
    """``matched``: the stop token (or string) the engine reports, if any.

    vLLM and SGLang keep a matched stop token id at the end of the ids; should one
    ever drop it, it is put back, so a ``"stop"`` completion always ends with it.
    """
    ids = list(token_ids)
    if finish_reason == "stop" and isinstance(matched, int) and matched in stop_ids and (not ids or ids[-1] != matched):
        ids.append(matched)
    if finish_reason in ("stop", "length"):
        return Completion(tuple(ids), finish_reason, None if logprobs is None else tuple(logprobs), cached_tokens)
    raise EngineError(
        f"{where}: the request finished with {finish_reason!r} (matched {matched!r}) instead of 'stop' or 'length'"
    )


def vllm_sampling_params(stop_ids: Sequence[int], max_tokens: int, sampling: Sampling, logprobs: bool):
    """One request's ``vllm.SamplingParams``, for the in-process vLLM engines."""
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=max_tokens,
        stop_token_ids=list(stop_ids),
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=sampling.seed,
        skip_special_tokens=False,
        detokenize=False,
        logprobs=0 if logprobs else None,
    )


def vllm_completion(output, stop_ids: Sequence[int], logprobs: bool, *, where: str) -> Completion:
    """A ``vllm.RequestOutput`` of one request as a :class:`Completion`."""
    choice = output.outputs[0]
    scores = None
    if logprobs and choice.logprobs is not None:
        scores = [step[token].logprob for step, token in zip(choice.logprobs, choice.token_ids)]
    return to_completion(
        choice.token_ids,
        choice.finish_reason,
        choice.stop_reason,
        stop_ids,
        scores,
        output.num_cached_tokens,
        where=where,
    )
