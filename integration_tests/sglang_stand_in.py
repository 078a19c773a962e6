"""A stand-in for an SGLang server (no CPU build exists) that speaks its native ``/generate``.

It rejects any field SGLang does not have (HOSTS.md, and SGLang's ``GenerateReqInput`` /
``SamplingParams``), answers ``output_ids`` with ``meta_info.finish_reason`` as ``{"type",
"matched"}`` or ``{"type", "length"}`` and ``meta_info.cached_tokens`` (with ``stream``, SGLang's
server-sent events: the ids so far in each, or the new ones only as with SGLang's
``--incremental-streaming-output``), and gets its tokens from a real vLLM server, so a trained
model's parallel blocks flow through SGLang's wire.

It refuses what SGLang refuses, in its words: in its tokenizer manager, a request whose prompt,
or prompt and ``max_new_tokens``, is over the context (the prompt counted with the tokens that
speculative decoding reserves); in its scheduler, a prompt of ``max_req_len - 5`` tokens or more
(``max_req_len`` = min(context - 1, KV pool - 1)), whose ``max_new_tokens`` it cuts to fit. It
says the context at ``/v1/models`` (``max_model_len``) and where the model lies at
``/get_model_info``, as SGLang does, and answers ``/health``, which SGLang's router polls before
it routes to a worker.
"""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import contextmanager

from threadweaver.vllm_orchestrator.serve import free_port

REQUEST_FIELDS = {
    "text",
    "input_ids",
    "sampling_params",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "stream",
    # what SGLang's router (sglang-router 0.3) adds when it re-serialises a request for a worker
    "model",
    "log_metrics",
    "return_hidden_states",
    "background",
    "no_logs",
    "return_bytes",
    "return_entropy",
}
SAMPLING_FIELDS = {
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "regex",
    "json_schema",
    "n",
    "sampling_seed",
}


class SGLangStandIn:
    """``POST /generate`` in SGLang's shape, answered by a vLLM server."""

    def __init__(self, vllm_url: str, model: str, fail_first: int = 0):
        self.vllm_url, self.model, self.fail_first = vllm_url, model, fail_first
        self.requests: list[dict] = []
        self.context_len: int | None = None  # the vLLM server's, read at the first request
        self.lists_window = True  # False: /v1/models without max_model_len, as SGLang's router answers it
        self.incremental = False  # True: a stream's events carry the new ids only
        self.reserve = 0  # tokens counted in every prompt, as SGLang reserves them for speculative decoding (EAGLE)
        self.pool_tokens: int | None = None  # a KV pool smaller than the context: it bounds a request too
        self.refuse_always: str | None = None  # a message to refuse every request with (a 400)

    async def _context_len(self) -> int:
        if self.context_len is None:
            from aiohttp import ClientSession

            async with ClientSession() as session:
                async with session.get(self.vllm_url + "/v1/models") as response:
                    self.context_len = (await response.json())["data"][0]["max_model_len"]
        return self.context_len

    async def models(self, request):
        from aiohttp import web

        card = {"id": self.model, "object": "model", "root": self.model}
        if self.lists_window:
            card["max_model_len"] = await self._context_len()
        return web.json_response({"object": "list", "data": [card]})

    async def model_info(self, request):
        from aiohttp import web

        return web.json_response({"model_path": self.model, "tokenizer_path": self.model, "is_generation": True})

    async def tokenizer_refusal(self, body: dict) -> str | None:
        """SGLang's tokenizer manager's refusal of a request over the context, in its words
        (``_validate_one_request``: the prompt counted with the tokens reserved for speculative decoding)."""
        context, counted = await self._context_len(), len(body["input_ids"]) + self.reserve
        new = body["sampling_params"].get("max_new_tokens")
        if counted >= context:
            return f"The input ({counted} tokens) is longer than the model's context length ({context} tokens)."
        if new is not None and new + counted > context:
            return (
                f"Requested token count exceeds the model's maximum context length of {context} tokens. You "
                f"requested a total of {new + counted} tokens: {counted} tokens from the input messages and {new} "
                "tokens for the completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit."
            )
        return None

    async def longest_request(self) -> int:
        """SGLang's scheduler's ``max_req_len``: min(context - 1, KV pool - 1)."""
        return min(await self._context_len() - 1, (self.pool_tokens or 1 << 62) - 1)

    async def scheduler_refusal(self, body: dict) -> str | None:
        """SGLang's scheduler's refusal of a prompt of ``max_req_len - 5`` tokens or more
        (``validate_input_length``)."""
        cap, prompt = await self.longest_request() - 5, len(body["input_ids"])
        if prompt >= cap:
            return (
                f"Input length ({prompt} tokens) exceeds the maximum allowed length ({cap} tokens). Use a shorter "
                "input or enable --allow-auto-truncate."
            )
        return None

    async def health(self, request):
        from aiohttp import web

        return web.Response(text="ok")

    async def generate(self, request):
        from aiohttp import ClientSession, web

        body = await request.json()
        self.requests.append(body)
        if len(self.requests) <= self.fail_first:
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        unknown = set(body) - REQUEST_FIELDS or set(body.get("sampling_params", {})) - SAMPLING_FIELDS
        if unknown or not isinstance(body.get("input_ids"), list):
            return web.json_response({"error": {"message": f"unknown fields {sorted(unknown)}"}}, status=400)
        if self.refuse_always:
            return web.json_response({"error": {"message": self.refuse_always}}, status=400)
        # refused: 400, or in a stream (HTTP 200) an error event (the tokenizer manager's) or an abort (the scheduler's)
        if refusal := await self.tokenizer_refusal(body):
            if body.get("stream"):
                return await self.events(request, [{"error": {"message": refusal}}])
            return web.json_response({"error": {"message": refusal}}, status=400)
        if refusal := await self.scheduler_refusal(body):
            if body.get("stream"):
                finish = {"type": "abort", "message": refusal, "status_code": 400, "err_type": "BadRequestError"}
                return await self.events(
                    request, [{"text": "", "output_ids": [], "meta_info": {"finish_reason": finish}}]
                )
            return web.json_response({"error": {"message": refusal}}, status=400)
        params = body["sampling_params"]
        served = await self.longest_request() - len(body["input_ids"]) - 1  # the scheduler's clamp, silent
        vllm_body = {
            "model": self.model,
            "prompt": body["input_ids"],
            "max_tokens": min(params["max_new_tokens"], served),
            "stop_token_ids": params.get("stop_token_ids", []),
            "temperature": params["temperature"],
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if body.get("return_logprob"):
            vllm_body["logprobs"] = 0
        if body.get("stream"):
            return await self.streamed(request, body, vllm_body)
        async with ClientSession() as session:
            async with session.post(self.vllm_url + "/v1/completions", json=vllm_body) as response:
                reply = await response.json()
        if "choices" not in reply:
            return web.json_response({"error": {"message": reply["error"]["message"]}}, status=400)
        choice = reply["choices"][0]
        ids = choice["token_ids"]
        cached = ((reply.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        meta = self.meta(body, ids, choice["finish_reason"], choice.get("stop_reason"), cached)
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(choice["logprobs"]["token_logprobs"], ids)]
        return web.json_response({"text": "", "output_ids": ids, "meta_info": meta})

    def meta(self, body: dict, ids: list, finish_reason, stop_reason, cached: int) -> dict:
        """SGLang's ``meta_info`` of a reply, or of a stream event (``finish_reason`` None until the last)."""
        finish = None
        if finish_reason == "stop":
            finish = {"type": "stop", "matched": stop_reason}
        elif finish_reason is not None:
            finish = {"type": "length", "length": len(ids)}
        return {
            "id": "stand-in",
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(ids),
            "cached_tokens": cached,
        }

    async def streamed(self, request, body: dict, vllm_body: dict):
        """SGLang's stream of ``/generate``, event by event as vLLM's comes: each event's ``output_ids`` all so
        far, or the new ones only where ``incremental`` (SGLang's ``--incremental-streaming-output``); its
        ``meta_info`` counts all so far."""
        from aiohttp import ClientSession

        response = await self.open_events(request)
        ids: list[int] = []
        logprobs: list[list] = []
        async with ClientSession() as session:
            async with session.post(self.vllm_url + "/v1/completions", json={**vllm_body, "stream": True}) as vllm:
                async for line in vllm.content:
                    if not line.startswith(b"data: ") or line[6:].strip() == b"[DONE]":
                        continue
                    for choice in json.loads(line[6:]).get("choices") or ():
                        new = choice.get("token_ids") or []
                        scores = (choice.get("logprobs") or {}).get("token_logprobs") or []
                        ids.extend(new)
                        logprobs.extend([lp, t, None] for lp, t in zip(scores, new))
                        meta = self.meta(body, ids, choice.get("finish_reason"), choice.get("stop_reason"), 0)
                        if body.get("return_logprob"):
                            meta["output_token_logprobs"] = (
                                logprobs[len(logprobs) - len(new) :] if self.incremental else list(logprobs)
                            )
                        event = {"text": "", "output_ids": new if self.incremental else list(ids), "meta_info": meta}
                        await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        return await self.close_events(response)

    async def events(self, request, events: list[dict]):
        response = await self.open_events(request)
        for event in events:
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        return await self.close_events(response)

    async def open_events(self, request):
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        return response

    async def close_events(self, response):
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@contextmanager
def sglang_stand_in(vllm_url: str, model: str):
    """(stand-in object, its base URL), served from a thread with its own event loop."""
    from aiohttp import web

    server = SGLangStandIn(vllm_url, model)
    app = web.Application()
    app.router.add_post("/generate", server.generate)
    app.router.add_get("/health", server.health)
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/get_model_info", server.model_info)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
