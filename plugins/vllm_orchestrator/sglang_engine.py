"""SGLang's native ``/generate`` over HTTP, in token space (``input_ids`` in, ``output_ids`` out).

SGLang's radix cache shares the prefix of a block's threads without any hint; its stream gives
a fork-join reply token by token. SGLang refuses a request whose prompt and ``max_new_tokens``
reach its context length, so each request is fitted into the window: the window is read from
``/v1/models`` (``max_model_len``), or, where that does not say (SGLang's router answers it for
its workers, without one), from SGLang's first refusal.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence

from threadweaver.engine import Completion, EngineError, RequestRefused, Sampling, to_completion

from .http import HTTPOptions, JSONClient, SessionKeyed

_WINDOW_IN_REFUSAL = re.compile(r"context length (?:of |\()(\d+) tokens")
"""The context length in SGLang's two refusals: "... exceeds the model's maximum context length of N tokens"
and "The input (n tokens) is longer than the model's context length (N tokens)"."""


def _room(context: int | None, prompt_ids: Sequence[int], max_tokens: int) -> int:
    """The most new tokens a request may ask for: ``max_tokens``, within the window where it is known."""
    return max_tokens if context is None else min(max_tokens, context - 1 - len(prompt_ids))


def _error_message(error) -> str:
    return str(error.get("message", error) if isinstance(error, dict) else error)


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
        self._server: dict = {}  # what the server said of its model; filled in place, so pinned views share it

    @property
    def where(self) -> str:
        return f"SGLang server at {self.client.base_url}"

    async def model_root(self) -> str:
        """Where the server loaded its tokenizer from (``/get_model_info``), as it was given it."""
        if "root" not in self._server:
            info = await self.client.get("/get_model_info")
            root = info.get("tokenizer_path") or info.get("model_path")
            if not isinstance(root, str) or not root:
                raise EngineError(f"{self.where} did not say where its model is (/get_model_info: {sorted(info)})")
            self._server["root"] = root
        return self._server["root"]

    async def model_context(self) -> int | None:
        """The model's context in tokens, where the server says (``max_model_len`` at ``/v1/models``), or as a
        refusal said it; else None."""
        if "context" not in self._server:
            try:
                cards = (await self.client.get("/v1/models")).get("data") or [{}]
            except RequestRefused:  # a server without the route: a refusal will say the window
                cards = [{}]
            context = cards[0].get("max_model_len") if isinstance(cards[0], dict) else None
            self._server.setdefault("context", context if isinstance(context, int) and context > 0 else None)
        return self._server["context"]

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion:
        context = await self.model_context()
        room = _room(context, prompt_ids, max_tokens)
        if room <= 0:  # SGLang wants prompt + max_new_tokens under its context length
            return to_completion((), "length", None, stop_ids, where=self.where)
        try:
            reply = await self.client.post("/generate", self._body(prompt_ids, stop_ids, room, sampling), self.headers)
        except RequestRefused as refusal:
            if not self._learnt_window(str(refusal), context):
                raise
            return await self.generate(prompt_ids, stop_ids, max_tokens, sampling)
        if "output_ids" not in reply:
            raise EngineError(f"{self.where} returned no output_ids; the reply has {sorted(reply)}")
        meta = reply.get("meta_info") or {}
        logprobs = [entry[0] for entry in meta.get("output_token_logprobs") or ()] if self.logprobs else None
        return self._completion(reply["output_ids"], meta, stop_ids, logprobs)

    async def stream(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> AsyncIterator[tuple[int, ...] | Completion]:
        """The new ids of each of SGLang's stream events, then the completion.

        An event's ``output_ids`` are all so far (SGLang's default) or the new ones only (with
        ``--incremental-streaming-output``, and in some versions always): ``meta_info.completion_tokens``,
        the count so far, says which. A refusal comes as an error event in a 200 stream."""
        context = await self.model_context()
        room = _room(context, prompt_ids, max_tokens)
        if room <= 0:
            yield to_completion((), "length", None, stop_ids, where=self.where)
            return
        body = {**self._body(prompt_ids, stop_ids, room, sampling), "stream": True}
        ids: list[int] = []
        logprobs: list[float] = []
        meta: dict = {}
        async for event in self.client.events("/generate", body, self.headers):
            if "error" in event:
                message = _error_message(event["error"])
                if not ids and self._learnt_window(message, context):
                    async for item in self.stream(prompt_ids, stop_ids, max_tokens, sampling):
                        yield item
                    return
                raise RequestRefused(f"{self.where} refused POST /generate in its stream: {message}")
            meta = event.get("meta_info") or {}
            chunk = list(event.get("output_ids") or ())
            whole = len(chunk) == meta.get("completion_tokens", -1)  # all so far, not the new ones only
            new = chunk[len(ids) :] if whole else chunk
            if self.logprobs:
                entries = [entry[0] for entry in meta.get("output_token_logprobs") or ()]
                logprobs.extend(entries[len(logprobs) :] if whole else entries)
            if new:
                ids.extend(new)
                yield tuple(new)
        yield self._completion(ids, meta, stop_ids, logprobs if self.logprobs else None)

    def _learnt_window(self, refusal: str, fitted_to: int | None) -> bool:
        """Whether ``refusal`` names a window other than ``fitted_to``, the one the request was fitted to: then
        it is the window, and the request is to be sent again fitted (once: the next refusal names the same)."""
        window = _WINDOW_IN_REFUSAL.search(refusal)
        if window is None or int(window.group(1)) == fitted_to:
            return False
        self._server["context"] = int(window.group(1))
        return True

    def _completion(self, ids, meta: dict, stop_ids: Sequence[int], logprobs) -> Completion:
        finish = meta.get("finish_reason") or {}
        return to_completion(
            ids,
            finish.get("type"),
            finish.get("matched"),
            stop_ids,
            logprobs,
            meta.get("cached_tokens"),
            where=self.where,
        )

    def _body(self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_new_tokens: int, sampling: Sampling):
        params = {
            "max_new_tokens": max_new_tokens,
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
        return {"input_ids": list(prompt_ids), "sampling_params": params, "return_logprob": self.logprobs}

    async def aclose(self) -> None:
        await self.client.aclose()
