"""vLLM's OpenAI-compatible server over HTTP, in token space.

Prompts go as token-id lists to ``/v1/completions`` with ``stop_token_ids`` and
``return_token_ids``, so nothing is ever re-tokenised: each thread's context is the
exact ids of the shared prefix, which is what lets vLLM's prefix cache hit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from threadweaver.engine import Completion, EngineError, Sampling, to_completion

from .http import HTTPOptions, JSONClient, SessionKeyed
from .wire import vllm_params


class VLLMServerEngine(SessionKeyed):
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        options: HTTPOptions = HTTPOptions(),
        logprobs: bool = False,
        extra_body: dict | None = None,
    ):
        """``model``: the served model name (``None``: the only one served).

        ``extra_body`` is merged into every request (vLLM's own fields, e.g. ``min_tokens``).
        """
        self.client = JSONClient(base_url, options, what="vLLM server")
        self.model = model
        self.logprobs = logprobs
        self.extra_body = dict(extra_body or {})
        self._served: dict = {}  # the model card; filled in place, so pinned views share it

    async def model_root(self) -> str:
        """Where the server loaded the model from (a directory or hub id): its tokenizer lives there."""
        card = await self._model_card()
        return card.get("root") or card["id"]

    async def model_context(self) -> int | None:
        """The model's context in tokens, as the server reports it (``max_model_len``)."""
        return (await self._model_card()).get("max_model_len")

    async def prompt_window(self) -> int | None:
        """The prompt length that leaves no room to generate: the context."""
        return await self.model_context()

    async def served_models(self) -> tuple[list[str], list[str]]:
        """The names the server answers to: its models', then its LoRA adapters'."""
        models, adapters = await self._cards()
        return [c["id"] for c in models], [c["id"] for c in adapters]

    async def _cards(self) -> tuple[list[dict], list[dict]]:
        """The server's model cards (those with an id): its models', then its LoRA adapters' (with a ``parent``)."""
        cards = [c for c in (await self.client.get("/v1/models")).get("data", []) if isinstance(c, dict) and "id" in c]
        return [c for c in cards if not c.get("parent")], [c for c in cards if c.get("parent")]

    async def _model_card(self) -> dict:
        if not self._served:
            models, adapters = await self._cards()
            cards = [*models, *adapters]
            served = [card["id"] for card in cards]
            if self.model is None and len({card.get("root") or card["id"] for card in models}) != 1:  # aliases: one
                raise EngineError(
                    f"the vLLM server at {self.client.base_url} serves {served}; name one (model=, --served-model)"
                )
            if self.model is not None and self.model not in served:
                raise EngineError(
                    f"the vLLM server at {self.client.base_url} does not serve model {self.model!r}; it serves {served}"
                )
            self._served.update(models[0] if self.model is None else cards[served.index(self.model)])
        return self._served

    async def _body(self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling):
        """The ``/v1/completions`` body of one request, or None where the context fills the model's window."""
        card = await self._model_card()
        room = card.get("max_model_len", len(prompt_ids) + max_tokens) - len(prompt_ids)
        if room <= 0:
            return None
        params = vllm_params(stop_ids, min(max_tokens, room), sampling, self.logprobs)
        return {"model": card["id"], "prompt": list(prompt_ids), "return_token_ids": True, **params, **self.extra_body}

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion:
        body = await self._body(prompt_ids, stop_ids, max_tokens, sampling)
        if body is None:
            return to_completion((), "length", None, stop_ids, where=f"vLLM server at {self.client.base_url}")
        reply = await self.client.post("/v1/completions", body, self.headers)
        choice = reply["choices"][0]
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") if self.logprobs else None
        return self._completion(self._token_ids(choice), choice, stop_ids, logprobs, reply)

    async def stream(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> AsyncIterator[tuple[int, ...] | Completion]:
        """The new token ids of each of the server's stream chunks, then the completion."""
        body = await self._body(prompt_ids, stop_ids, max_tokens, sampling)
        if body is None:
            yield to_completion((), "length", None, stop_ids, where=f"vLLM server at {self.client.base_url}")
            return
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        ids: list[int] = []
        logprobs: list[float] = []
        last, final = {}, {}  # the choice that says how the request ended; the event with the usage
        async for event in self.client.events("/v1/completions", body, self.headers):
            final = event if event.get("usage") else final
            for choice in event.get("choices") or ():
                new = self._token_ids(choice)
                logprobs.extend((choice.get("logprobs") or {}).get("token_logprobs") or ())
                if new:
                    ids.extend(new)
                    yield tuple(new)
                if choice.get("finish_reason") is not None:
                    last = choice
        yield self._completion(ids, last, stop_ids, logprobs if self.logprobs else None, final)

    def _token_ids(self, choice: dict) -> list[int]:
        if choice.get("token_ids") is None:
            raise EngineError(
                f"the server at {self.client.base_url} returned no token_ids: it needs vLLM with "
                "return_token_ids (0.10.2 or newer)"
            )
        return choice["token_ids"]

    def _completion(self, ids, choice: dict, stop_ids, logprobs, reply: dict) -> Completion:
        """``reply``: the server's reply, or its stream's last event (usage, and the request's
        timings where the server runs with ``--enable-per-request-metrics``)."""
        details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
        metrics = reply.get("metrics") or {}
        waits = (metrics.get("queue_time_ms"), metrics.get("time_to_first_token_ms"))
        return to_completion(
            ids,
            choice.get("finish_reason"),
            choice.get("stop_reason"),
            stop_ids,
            logprobs,
            details.get("cached_tokens"),
            None if None in waits else sum(waits) / 1000,
            where=f"vLLM server at {self.client.base_url}",
        )

    async def aclose(self) -> None:
        await self.client.aclose()
