"""SGLang's native ``/generate`` over HTTP, in token space (``input_ids`` in, ``output_ids`` out).

SGLang's radix cache shares the prefix of a block's threads without any hint.
"""

from __future__ import annotations

from collections.abc import Sequence

from threadweaver.engine import Completion, EngineError, Sampling, to_completion

from .http import HTTPOptions, JSONClient, SessionKeyed


class SGLangEngine(SessionKeyed):
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:30000",
        *,
        options: HTTPOptions = HTTPOptions(),
        logprobs: bool = False,
        extra_sampling: dict | None = None,
    ):
        self.client = JSONClient(base_url, options, what="SGLang server")
        self.logprobs = logprobs
        self.extra_sampling = dict(extra_sampling or {})

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion:
        params = {
            "max_new_tokens": max_tokens,
            "stop_token_ids": list(stop_ids),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        params.update(self.extra_sampling)
        body = {"input_ids": list(prompt_ids), "sampling_params": params, "return_logprob": self.logprobs}
        reply = await self.client.post("/generate", body, self.headers)
        where = f"SGLang server at {self.client.base_url}"
        if "output_ids" not in reply:
            raise EngineError(f"{where} returned no output_ids; the reply has {sorted(reply)}")
        meta = reply.get("meta_info", {})
        finish = meta.get("finish_reason") or {}
        logprobs = None
        if self.logprobs:
            logprobs = [entry[0] for entry in meta.get("output_token_logprobs", [])]
        return to_completion(
            reply["output_ids"],
            finish.get("type"),
            finish.get("matched"),
            stop_ids,
            logprobs,
            meta.get("cached_tokens"),
            where=where,
        )

    async def aclose(self) -> None:
        await self.client.aclose()
