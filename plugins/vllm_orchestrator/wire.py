"""vLLM's in-process request and reply types, as the orchestrator's engine contract."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from threadweaver.engine import Completion, Sampling, to_completion
from threadweaver.hosts import check_host


def vllm_params(stop_ids: Sequence[int], max_tokens: int, sampling: Sampling, logprobs: bool) -> dict:
    """One request's sampling parameters under vLLM's names, the same over HTTP and in process."""
    params = {"max_tokens": max_tokens, "stop_token_ids": list(stop_ids), "skip_special_tokens": False}
    return {**params, **dataclasses.asdict(sampling), **({"logprobs": 0} if logprobs else {})}


def vllm_sampling_params(stop_ids: Sequence[int], max_tokens: int, sampling: Sampling, logprobs: bool):
    """One request's ``vllm.SamplingParams``, for the in-process vLLM engines."""
    check_host("vllm")
    from vllm import SamplingParams

    return SamplingParams(**vllm_params(stop_ids, max_tokens, sampling, logprobs), detokenize=False)


def vllm_completion(output, stop_ids: Sequence[int], logprobs: bool, *, where: str) -> Completion:
    """A ``vllm.RequestOutput`` of one request as a :class:`Completion`."""
    choice = output.outputs[0]
    scores = None
    if logprobs and choice.logprobs is not None:
        scores = [step[token].logprob for step, token in zip(choice.logprobs, choice.token_ids)]
    stats = output.metrics  # vLLM's RequestStateStats, where it logs stats; engine-core clock
    waited = None
    if stats is not None and getattr(stats, "queued_ts", 0) > 0 and getattr(stats, "first_token_ts", 0) > 0:
        waited = stats.first_token_ts - stats.queued_ts
    return to_completion(
        choice.token_ids,
        choice.finish_reason,
        choice.stop_reason,
        stop_ids,
        scores,
        output.num_cached_tokens,
        waited,
        where=where,
    )
