"""Engines over synchronous batch APIs: a batch that no request waits for any more can stop midway."""

import asyncio
import threading
import time

import pytest

from threadweaver.engine import Completion, Sampling
from threadweaver.vllm_orchestrator.batching import BatchingEngine


class UntilAbandoned(BatchingEngine):
    """Decodes (in its worker thread) until no request of the batch waits for it, or 10 s."""

    def __init__(self, steps: int = 1000):
        super().__init__(max_batch=8)
        self.started, self.stopped = threading.Event(), threading.Event()
        self.steps = steps

    def generate_batch(self, requests):
        self.started.set()
        for _ in range(self.steps):
            if self.abandoned():
                self.stopped.set()
                break
            time.sleep(0.01)
        return [Completion((1,), "length")] * len(requests)


async def until(event: threading.Event) -> bool:
    return await asyncio.to_thread(event.wait, 10)


def test_a_batch_stops_once_every_request_in_it_is_given_up_and_not_before():
    async def run():
        engine = UntilAbandoned()
        first, second = (asyncio.ensure_future(engine.generate([5], [9], 4, Sampling())) for _ in range(2))
        assert await until(engine.started)
        first.cancel()  # a trajectory timed out: the other one still waits
        await asyncio.sleep(0.1)
        assert not engine.stopped.is_set()
        second.cancel()
        assert await until(engine.stopped)

    asyncio.run(run())


def test_closing_the_engine_gives_up_the_batch_in_flight():
    async def run():
        engine = UntilAbandoned()
        request = asyncio.ensure_future(engine.generate([5], [9], 4, Sampling()))
        assert await until(engine.started)
        await engine.aclose()
        assert await until(engine.stopped) and request.cancelled()

    asyncio.run(run())


class ByMaxTokens(UntilAbandoned):
    def batch_key(self, request):
        return request.max_tokens


def test_closing_the_engine_gives_up_the_groups_that_wait_behind_the_batch_in_flight():
    """One drain takes requests of several batch keys (TransformersEngine's: stop ids and sampling): those
    waiting behind the group in the worker thread are given up too, and so is a request made while the
    worker unwinds; none is left waiting forever."""

    async def run():
        engine = ByMaxTokens()
        running, behind = (asyncio.ensure_future(engine.generate([5], [9], n, Sampling())) for n in (4, 5))
        assert await until(engine.started)
        closing = asyncio.ensure_future(engine.aclose())
        await asyncio.sleep(0)
        late = asyncio.ensure_future(engine.generate([5], [9], 6, Sampling()))
        await asyncio.wait_for(closing, 10)
        await asyncio.wait([running, behind, late], timeout=10)
        assert running.cancelled() and behind.cancelled() and late.cancelled()

    asyncio.run(run())


class Answering(BatchingEngine):
    """Answers each batch with what it is given (a wrong count, or not a list), or raises from its key."""

    def __init__(self, answer=None, key_fails=False):
        super().__init__(max_batch=8)
        self.answer, self.key_fails = answer, key_fails

    def batch_key(self, request):
        if self.key_fails:
            raise ValueError("no key")
        return ()

    def generate_batch(self, requests):
        return self.answer


@pytest.mark.parametrize(
    "engine, error",
    [
        (Answering([Completion((1,), "length")]), "Answering.generate_batch answered 1 of 2 requests"),
        (Answering(None), "'NoneType' object is not iterable"),
        (Answering(key_fails=True), "no key"),
    ],
)
def test_a_batch_that_fails_gives_every_request_its_error_not_a_cancellation(engine, error):
    async def run():
        requests = [asyncio.ensure_future(engine.generate([5], [9], 4, Sampling())) for _ in range(2)]
        done, _ = await asyncio.wait(requests, timeout=10)
        return [request.exception() for request in done]

    failures = asyncio.run(run())
    assert len(failures) == 2 and all(error in str(failure) for failure in failures), failures


def test_a_batch_decoded_outside_the_engines_drain_is_nobodys_to_give_up():
    from threadweaver.vllm_orchestrator.batching import Request

    engine = UntilAbandoned(steps=20)
    assert engine.generate_batch([Request((5,), (9,), 4, Sampling())]) and not engine.stopped.is_set()


def test_an_exception_in_a_requests_place_fails_that_request_alone():
    from threadweaver.engine import RequestRefused

    class RefusesLongPrompts(BatchingEngine):
        def generate_batch(self, requests):
            return [RequestRefused("too long") if len(r.prompt_ids) > 2 else Completion((7,), "stop") for r in requests]

    async def run():
        engine = RefusesLongPrompts(max_batch=8)
        calls = (engine.generate(ids, (), 4, Sampling()) for ids in ([1], [1, 2, 3], [2]))
        return await asyncio.gather(*calls, return_exceptions=True)

    first, refused, last = asyncio.run(run())
    assert first.token_ids == last.token_ids == (7,) and isinstance(refused, RequestRefused)


def test_the_transformers_engine_stops_a_batch_nobody_waits_for_at_its_next_token():
    """A trajectory that timed out used to leave its batch decoding to ``max_tokens`` in the worker thread."""
    import os

    from transformers import AutoModelForCausalLM

    from threadweaver.vllm_orchestrator import TransformersEngine

    model = AutoModelForCausalLM.from_pretrained(
        os.path.join(os.path.dirname(__file__), "..", "apps", "quickstart", "models", "parallel")
    )
    stop = (model.config.vocab_size - 1,)
    steps = []
    model.register_forward_hook(lambda *_: steps.append(1))

    async def run():
        engine = TransformersEngine(model)
        whole = await engine.generate([1, 2, 3], stop, 300, Sampling())
        assert len(whole.token_ids) == 300  # nothing stops it before max_tokens
        steps.clear()
        request = asyncio.ensure_future(engine.generate([1, 2, 3], stop, 3000, Sampling()))
        while not steps:
            await asyncio.sleep(0.01)
        request.cancel()
        await asyncio.wait([engine._worker], timeout=60)
        assert engine._worker.done() and len(steps) < 300

    asyncio.run(run())


def test_the_transformers_engine_refuses_a_prompt_id_without_an_embedding_row_alone():
    """torch's "index out of range in self" failed the whole batch the request joined."""
    import os

    from transformers import AutoModelForCausalLM

    from threadweaver.engine import RequestRefused
    from threadweaver.vllm_orchestrator import TransformersEngine

    model = AutoModelForCausalLM.from_pretrained(
        os.path.join(os.path.dirname(__file__), "..", "apps", "quickstart", "models", "parallel")
    )
    rows = model.get_input_embeddings().num_embeddings

    async def run():
        engine = TransformersEngine(model)
        return await asyncio.gather(
            engine.generate([1, 2, 3], (), 4, Sampling()),
            engine.generate([1, rows], (), 4, Sampling()),
            return_exceptions=True,
        )

    good, refused = asyncio.run(run())
    assert not isinstance(good, BaseException) and good.token_ids  # the batch it shared decoded
    assert isinstance(refused, RequestRefused)
    assert str(refused) == f"transformers: token id {rows} is outside the model's vocabulary (0 to {rows - 1})"
