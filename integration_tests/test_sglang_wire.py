"""SGLangEngine against SGLang's native ``/generate`` wire contract.

SGLang has no CPU build, so no real SGLang server can run on this machine. The test
stands up a stand-in that speaks ``/generate`` as SGLang defines it (HOSTS.md, and
SGLang's ``GenerateReqInput`` / ``SamplingParams``): it rejects any field SGLang does not
have, answers ``output_ids`` with ``meta_info.finish_reason`` as ``{"type", "matched"}``
or ``{"type", "length"}``, and gets its tokens from the real vLLM server on loopback,
so a trained model's parallel blocks flow through the SGLang engine. The trajectories
must equal those decoded over vLLM's own API, token for token.
"""

import asyncio
import threading

import pytest
from decoding import decode, generate_once, prompts

from threadweaver.format import Format
from threadweaver.orchestrator import Limits

pytestmark = pytest.mark.slow

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
            "cached_tokens": 0,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(choice["logprobs"]["token_logprobs"], ids)]
        return web.json_response({"text": "", "output_ids": ids, "meta_info": meta})


@pytest.fixture
def stand_in(trained, trained_server):
    """(stand-in object, its base URL), served from a thread with its own event loop."""
    from aiohttp import web

    from threadweaver.vllm_orchestrator.serve import free_port

    server = SGLangStandIn(trained_server, str(trained[1]))
    app = web.Application()
    app.router.add_post("/generate", server.generate)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_sglang_engine_decodes_the_same_trajectories(trained, trained_server, stand_in):
    from transformers import AutoTokenizer

    from threadweaver.vllm_orchestrator.sglang_engine import SGLangEngine
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    server, url = stand_in
    tokenizer = AutoTokenizer.from_pretrained(trained[1])
    fmt = Format.from_tokenizer(tokenizer)
    prompt_list = prompts(trained[0], tokenizer, 4)
    limits = Limits(max_request_tokens=512)  # SGLang has no window size to ask for: stay inside it
    over_sglang = decode(SGLangEngine(url), fmt, prompt_list, limits)
    over_vllm = decode(VLLMServerEngine(trained_server), fmt, prompt_list, limits)
    assert [t.token_ids for t in over_sglang] == [t.token_ids for t in over_vllm]
    assert sum(t.stats.blocks for t in over_sglang) >= 3
    first = server.requests[0]
    assert first["input_ids"] in prompt_list
    assert first["sampling_params"]["no_stop_trim"] is True
    assert first["sampling_params"]["skip_special_tokens"] is False


def test_sglang_engine_retries_overload_and_returns_logprobs(trained, stand_in):
    from threadweaver.vllm_orchestrator.http import HTTPOptions
    from threadweaver.vllm_orchestrator.sglang_engine import SGLangEngine

    server, url = stand_in
    server.fail_first = 2
    engine = SGLangEngine(url, options=HTTPOptions(retries=2, backoff_s=0.01), logprobs=True)
    completion = generate_once(engine, [1, 5, 6, 7], [2], 5)
    assert len(server.requests) == 3
    assert len(completion.logprobs) == len(completion.token_ids) >= 1
    assert all(lp <= 0 for lp in completion.logprobs)


def test_sglang_errors_name_the_server_and_its_message(stand_in):
    from threadweaver.vllm_orchestrator.http import EngineError
    from threadweaver.vllm_orchestrator.sglang_engine import SGLangEngine

    server, url = stand_in
    engine = SGLangEngine(url, extra_sampling={"not_an_sglang_field": 1})
    with pytest.raises(EngineError, match=r"SGLang server at .* HTTP 400: unknown fields \['not_an_sglang_field'\]"):
        generate_once(engine, [1, 5], [2], 3)
