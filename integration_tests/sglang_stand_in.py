"""A stand-in for an SGLang server (no CPU build exists) that speaks its native ``/generate``.

It rejects any field SGLang does not have (HOSTS.md, and SGLang's ``GenerateReqInput`` /
``SamplingParams``), answers ``output_ids`` with ``meta_info.finish_reason`` as ``{"type",
"matched"}`` or ``{"type", "length"}`` and ``meta_info.cached_tokens``, and gets its tokens
from a real vLLM server, so a trained model's parallel blocks flow through SGLang's wire.
It also answers ``/health``, which SGLang's router polls before it routes to a worker.
"""

from __future__ import annotations

import asyncio
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
        params = body["sampling_params"]
        vllm_body = {
            "model": self.model,
            "prompt": body["input_ids"],
            "max_tokens": params["max_new_tokens"],
            "stop_token_ids": params.get("stop_token_ids", []),
            "temperature": params["temperature"],
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if body.get("return_logprob"):
            vllm_body["logprobs"] = 0
        async with ClientSession() as session:
            async with session.post(self.vllm_url + "/v1/completions", json=vllm_body) as response:
                reply = await response.json()
        if "choices" not in reply:  # SGLang also answers 400 to a request over the context length
            return web.json_response({"error": {"message": reply["error"]["message"]}}, status=400)
        choice = reply["choices"][0]
        ids = choice["token_ids"]
        if choice["finish_reason"] == "stop":
            finish = {"type": "stop", "matched": choice["stop_reason"]}
        else:
            finish = {"type": "length", "length": len(ids)}
        meta = {
            "id": "stand-in",
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(ids),
            "cached_tokens": ((reply.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(choice["logprobs"]["token_logprobs"], ids)]
        return web.json_response({"text": "", "output_ids": ids, "meta_info": meta})


@contextmanager
def sglang_stand_in(vllm_url: str, model: str):
    """(stand-in object, its base URL), served from a thread with its own event loop."""
    from aiohttp import web

    server = SGLangStandIn(vllm_url, model)
    app = web.Application()
    app.router.add_post("/generate", server.generate)
    app.router.add_get("/health", server.health)
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
