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
    limits = Limits(max_request_tokens=512)  # inside both windows (SGLang's holds one token fewer than vLLM's)
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


@pytest.mark.parametrize("lists_window", [True, False], ids=["window-listed", "window-from-refusal"])
def test_sglang_engine_fits_each_request_into_the_servers_window(trained, stand_in, lists_window):
    """SGLang refuses a prompt and ``max_new_tokens`` that reach its context length. The engine reads the
    window from ``/v1/models``, or, where that does not list it (SGLang's router answers for its workers),
    from the first refusal, which it then sends again fitted: nothing is refused twice."""
    import asyncio

    from threadweaver.engine import Sampling
    from threadweaver.vllm_orchestrator.sglang_engine import SGLangEngine

    server, url = stand_in
    server.lists_window = lists_window
    engine = SGLangEngine(url)

    async def run():
        try:
            near_end = [1] + [5, 6, 7] * 681  # 2,044 tokens: 3 fit under the 2,048-token window
            first = await engine.generate(near_end, [2], 4096, Sampling())
            full = await engine.generate([1] + [5] * 2046, [2], 4096, Sampling())  # no room: no request
            short = await engine.generate([1, 5, 6, 7], [2], 3, Sampling())
            return first, full, short, await engine.model_root()
        finally:
            await engine.aclose()

    first, full, short, root = asyncio.run(run())
    sent = [body["sampling_params"]["max_new_tokens"] for body in server.requests]
    assert sent == ([3, 3] if lists_window else [4096, 3, 3])  # the refused one, then the fitted one
    assert len(first.token_ids) <= 3 and (first.finish_reason == "length") == (len(first.token_ids) == 3)
    assert full.token_ids == () and full.finish_reason == "length"
    assert len(short.token_ids) <= 3
    assert root == str(trained[1])  # where the server loaded the model from: its tokenizer


def test_a_window_refused_again_is_the_servers_error(stand_in):
    """A refusal naming the window the request was fitted to is not sent again: it is the server's error
    (here ``extra_sampling`` overrides the fitted ``max_new_tokens``)."""
    from threadweaver.engine import RequestRefused
    from threadweaver.vllm_orchestrator.sglang_engine import SGLangEngine

    server, url = stand_in
    server.context_len = 100
    engine = SGLangEngine(url, extra_sampling={"max_new_tokens": 500})
    with pytest.raises(RequestRefused, match=r"HTTP 400: Requested token count exceeds .* length of 100 tokens"):
        generate_once(engine, [1, 5, 6, 7], [2], 5)
    assert len(server.requests) == 1


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
    asked = [body["sampling_params"]["max_new_tokens"] for body in server.requests]
    assert asked == [4096, 2047 - len(prompt), 2047 - len(prompt)]  # refused in the stream, learnt, then fitted
