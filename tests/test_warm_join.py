"""Limits.warm_join: the threads done so far are prefilled while a slow one still decodes,
and nothing else changes (tokens, requests, budget, what RL trains on)."""

import asyncio

from orchestrator_scripts import PROMPT, head

from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.testing import ScriptedEngine

FOUR = {
    PROMPT: "t " + head("1:a", "2:b", "3:c", "4:d"),
    "<Thread>1:": "aa</Thread>",
    "<Thread>2:": "bb</Thread>",
    "<Thread>3:": "cc</Thread>",
    "<Thread>4:": "dddddd</Thread>",
    "</Parallel>": " ok<EOS>",
    "</Thread>": "?",  # a warm-up's context ends with a thread; its one token is dropped
}


class SlowLastThread(ScriptedEngine):
    """Thread 4 takes 0.2 s; a warm-up fails when ``warmups_fail``."""

    def __init__(self, fmt, warmups_fail: bool = False):
        super().__init__(fmt, FOUR)
        self.warmups_fail = warmups_fail

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        context = self.fmt.decode(prompt_ids)
        if context.endswith("<Thread>4:"):
            await asyncio.sleep(0.2)
        if self.warmups_fail and context.endswith("</Thread>"):
            self.calls.append(list(prompt_ids))
            raise ConnectionError("the warm-up failed")
        return await super().generate(prompt_ids, stop_ids, max_tokens, sampling)


def decoded(fmt, limits, engine):
    orchestrator = Orchestrator(engine, fmt, limits, keep_calls=True)
    return asyncio.run(orchestrator.run(fmt.encode(PROMPT)))


def test_the_threads_done_are_prefilled_before_the_join_and_nothing_else_changes(fmt):
    plain = decoded(fmt, Limits(), SlowLastThread(fmt))
    engine = SlowLastThread(fmt)
    warm = decoded(fmt, Limits(warm_join=True), engine)
    assert warm.token_ids == plain.token_ids and warm.stats == plain.stats
    assert len(warm.requests) == len(plain.requests) and warm.calls == plain.calls  # RL sees no warm-up
    assert warm.warmups == 2 and plain.warmups == 0  # threads 1-2, then 1-3; thread 1 alone is cached already
    contexts = [fmt.decode(c) for c in engine.calls]
    continuation = next(c for c in contexts if c.endswith("</Parallel>"))
    warmups = [c for c in contexts if c.endswith("</Thread>")]
    assert [w.removeprefix(PROMPT + "t " + head("1:a", "2:b", "3:c", "4:d")) for w in warmups] == [
        "<Thread>1:aa</Thread><Thread>2:bb</Thread>",
        "<Thread>1:aa</Thread><Thread>2:bb</Thread><Thread>3:cc</Thread>",
    ]
    assert all(continuation.startswith(w) for w in warmups)  # prefixes of the continuation's context
    assert max(contexts.index(w) for w in warmups) < contexts.index(continuation)


def test_a_failed_warm_up_only_loses_its_gain(fmt):
    plain = decoded(fmt, Limits(), SlowLastThread(fmt))
    warm = decoded(fmt, Limits(warm_join=True), SlowLastThread(fmt, warmups_fail=True))
    assert warm.token_ids == plain.token_ids and not warm.degradations and warm.warmups == 2


def test_threads_one_after_another_need_no_warm_up(fmt):
    engine = SlowLastThread(fmt)
    t = decoded(fmt, Limits(warm_join=True, concurrent_threads=False), engine)
    assert t.warmups == 0 and not any(fmt.decode(c).endswith("</Thread>") for c in engine.calls)
