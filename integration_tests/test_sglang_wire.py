"""SGLangEngine against SGLang's native ``/generate`` wire contract.

SGLang has no CPU build, so no real SGLang server can run on this machine. The tests
stand up :mod:`sglang_stand_in`, which speaks ``/generate`` as SGLang defines it and gets
its tokens from the real vLLM server on loopback, so a trained model's parallel blocks
flow through the SGLang engine. The trajectories must equal those decoded over vLLM's own
API, token for token.
"""

import pytest
from decoding import decode, generate_once, prompts
from sglang_stand_in import sglang_stand_in

from threadweaver.format import Format
from threadweaver.orchestrator import Limits

pytestmark = pytest.mark.slow


@pytest.fixture
def stand_in(trained, trained_server):
    """(stand-in object, its base URL)."""
    with sglang_stand_in(trained_server, str(trained[1])) as served:
        yield served


def test_sglang_engine_decodes_the_same_trajectories(trained, trained_server, stand_in):
    from transformers import AutoTokenizer

    from threadweaver.vllm_orchestrator.sglang_engine import SGLangEngine
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    server, url = stand_in
    tokenizer = AutoTokenizer.from_pretrained(trained[1])
    fmt = Format.from_tokenizer(tokenizer)
    prompt_list = prompts(trained[0], tokenizer, 4)
    limits = Limits(max_request_tokens=512)  # inside both windows (SGLang serves 2 tokens fewer than vLLM)
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


def sent_max_new_tokens(server) -> list[int]:
    return [body["sampling_params"]["max_new_tokens"] for body in server.requests]


@pytest.mark.parametrize("lists_window", [True, False], ids=["window-listed", "window-from-refusal"])
def test_sglang_engine_fits_each_request_into_the_servers_window(trained, stand_in, lists_window):
    """SGLang serves a request at most ``max_req_len`` = context - 1 tokens and refuses a prompt of
    ``max_req_len - 5`` or more. The engine reads the context from ``/v1/models``, or, where that does not
    list it (SGLang's router answers for its workers), from the first refusal, and sends that request
    again fitted."""
    import asyncio

    from threadweaver.engine import Sampling
    from threadweaver.vllm_orchestrator.sglang_engine import SGLangEngine

    server, url = stand_in
    server.lists_window = lists_window
    engine = SGLangEngine(url)

    async def run():
        try:
            near_end = [1] + [5, 6, 7] * 676 + [5]  # 2,030 tokens: SGLang serves 16 more in a 2,048 window
            first = await engine.generate(near_end, [2], 4096, Sampling())
            full = await engine.generate([1] + [5] * 2041, [2], 4096, Sampling())  # 2,042: refused, so not sent
            short = await engine.generate([1, 5, 6, 7], [2], 3, Sampling())
            return first, full, short, await engine.model_root()
        finally:
            await engine.aclose()

    first, full, short, root = asyncio.run(run())
    assert sent_max_new_tokens(server) == ([16, 3] if lists_window else [4096, 16, 3])  # refused, then fitted
    assert len(first.token_ids) <= 16 and (first.finish_reason == "length") == (len(first.token_ids) == 16)
    assert full.token_ids == () and full.finish_reason == "length"
    assert len(short.token_ids) <= 3
    assert root == str(trained[1])  # where the server loaded the model from: its tokenizer


def test_requests_refused_together_each_go_again_fitted(stand_in):
    """Behind SGLang's router no route lists the window: the first requests of a batch, sent at once, are
    refused together. The first refusal teaches the window; each of the others is then fitted otherwise
    than it was sent, so it goes again too, rather than failing for a window already learnt."""
    import asyncio

    from threadweaver.engine import Sampling
    from threadweaver.vllm_orchestrator.sglang_engine import SGLangEngine

    server, url = stand_in
    server.lists_window = False
    near_end = [1] + [5, 6, 7] * 676 + [5]  # 2,030 tokens: 16 more fit

    async def run():
        engine = SGLangEngine(url)
        try:
            views = [engine.pinned() for _ in range(4)]  # four trajectories' views, sharing what was learnt
            return await asyncio.gather(*[v.generate(near_end, [2], 4096, Sampling()) for v in views])
        finally:
            await engine.aclose()

    completions = asyncio.run(run())
    sent = sent_max_new_tokens(server)
    assert sent.count(16) == 4 and set(sent) == {4096, 16}, sent
    assert all(len(c.token_ids) <= 16 for c in completions)


def test_sglang_engine_learns_the_limits_no_route_says(stand_in):
    """Two limits SGLang lists nowhere: the tokens it reserves in every prompt for speculative decoding
    (EAGLE: its refusal counts them in the prompt), and a KV pool smaller than the context, which lowers
    ``max_req_len`` (its scheduler's refusal says the longest prompt, in a stream as an abort)."""
    import asyncio

    from threadweaver.engine import Sampling
    from threadweaver.vllm_orchestrator.sglang_engine import SGLangEngine

    server, url = stand_in
    server.reserve, server.pool_tokens = 4, 1025  # max_req_len 1024: prompts under 1019 tokens

    async def run():
        engine = SGLangEngine(url)
        try:
            reserved = await engine.generate([1] + [5] * 999, [2], 4096, Sampling())
            over = [item async for item in engine.stream([1] + [5] * 1499, [2], 4096, Sampling())]
            return reserved, over, await engine.generate([1] + [5] * 999, [2], 4096, Sampling())
        finally:
            await engine.aclose()

    reserved, over, again = asyncio.run(run())
    # 1,000 tokens: 1,046 refused (with the 4 reserved, over 2,048), 1,042 served (the pool then cuts it to 23);
    # 1,500 tokens: 542 refused (the prompt is over 1,019), then not sent; 1,000 tokens again: 1,024 - 1 - 1,000 - 4
    assert sent_max_new_tokens(server) == [1046, 1042, 542, 19]
    assert len(reserved.token_ids) <= 23 and len(again.token_ids) <= 19
    assert over == [over[-1]] and over[-1].token_ids == () and over[-1].finish_reason == "length"


def test_a_refusal_that_teaches_nothing_is_the_servers_error(stand_in):
    """A refusal after which the request would ask for the same is not sent again: it is the server's
    error, in its words (here the limits it says, 100 tokens of context, hold 5 new tokens)."""
    from threadweaver.engine import RequestRefused
    from threadweaver.vllm_orchestrator.sglang_engine import SGLangEngine

    server, url = stand_in
    server.refuse_always = (
        "Requested token count exceeds the model's maximum context length of 100 tokens. You requested a total of "
        "10 tokens: 5 tokens from the input messages and 5 tokens for the completion."
    )
    with pytest.raises(RequestRefused, match=r"HTTP 400: Requested token count exceeds .* of 100 tokens"):
        generate_once(SGLangEngine(url), [1, 5, 6, 7], [2], 5)
    assert sent_max_new_tokens(server) == [5]
    with pytest.raises(ValueError, match="extra_sampling may not set max_new_tokens"):
        SGLangEngine(url, extra_sampling={"max_new_tokens": 500})


@pytest.mark.parametrize("incremental", [False, True], ids=["ids-so-far", "new-ids-only"])
def test_sglang_engine_streams_each_new_run_once(trained, stand_in, incremental):
    """SGLang's stream events carry the ids so far (its default) or the new ones only
    (``--incremental-streaming-output``): either way the engine yields each new run once, then the
    completion ``generate`` gives. A window refusal in a stream (an error event) is learnt as in a reply."""
    import asyncio

    from transformers import AutoTokenizer

    from threadweaver.engine import Sampling
    from threadweaver.vllm_orchestrator.sglang_engine import SGLangEngine

    server, url = stand_in
    server.incremental, server.lists_window = incremental, False
    tokenizer = AutoTokenizer.from_pretrained(trained[1])
    prompt, stop = prompts(trained[0], tokenizer, 1)[0], [tokenizer.eos_token_id]
    engine = SGLangEngine(url, logprobs=True)

    async def run():
        try:
            items = [item async for item in engine.stream(prompt, stop, 4096, Sampling())]
            return items, await engine.generate(prompt, stop, 4096, Sampling())
        finally:
            await engine.aclose()

    (*runs, streamed), whole = asyncio.run(run())
    assert len(runs) >= 3
    assert [t for run in runs for t in run] == list(streamed.token_ids) == list(whole.token_ids)
    assert streamed.finish_reason == whole.finish_reason
    assert streamed.logprobs == pytest.approx(whole.logprobs, abs=1e-3)
    fitted = 2046 - len(prompt)
    assert sent_max_new_tokens(server) == [4096, fitted, fitted]  # refused in the stream, learnt, then fitted
