"""Streaming a trajectory in order (threadweaver.streaming through Orchestrator.run(on_tokens=...))."""

import asyncio
import time

import pytest
from orchestrator_scripts import CASES, GOOD, NESTED, PROMPT

from threadweaver.engine import Completion
from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.testing import ScriptedEngine


class SlowThread(ScriptedEngine):
    """Requests whose context ends with ``slow`` take ``delay`` seconds; the rest answer at once."""

    def __init__(self, fmt, script, slow: str, delay: float = 0.3):
        super().__init__(fmt, script)
        self.slow, self.slow_delay = slow, delay

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        if self.fmt.decode(prompt_ids).endswith(self.slow):
            await asyncio.sleep(self.slow_delay)
        return await super().generate(prompt_ids, stop_ids, max_tokens, sampling)


def streamed(fmt, engine, limits=Limits()):
    runs = []
    started = time.monotonic()
    trajectory = asyncio.run(
        Orchestrator(engine, fmt, limits).run(
            fmt.encode(PROMPT), on_tokens=lambda ids: runs.append((time.monotonic() - started, fmt.decode(ids)))
        )
    )
    return runs, trajectory


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_streamed_runs_are_the_trajectory(fmt, case):
    script, limits, _ = CASES[case]
    runs = []
    trajectory = asyncio.run(
        Orchestrator(ScriptedEngine(fmt, script), fmt, limits).run(fmt.encode(PROMPT), on_tokens=runs.append)
    )
    assert [t for run in runs for t in run] == list(trajectory.token_ids)


def test_thread_one_shows_while_thread_two_still_decodes(fmt):
    runs, trajectory = streamed(fmt, SlowThread(fmt, GOOD, slow="<Thread>2:"))
    text = "".join(piece for _, piece in runs)
    assert text == fmt.decode(trajectory.token_ids)
    shown = {piece: at for at, piece in runs}
    assert shown["aa"] < 0.2 <= shown["bbbb"]  # thread 1 at once; thread 2 after its slow request


def test_thread_two_waits_for_thread_one_and_its_nested_block(fmt):
    runs, trajectory = streamed(fmt, SlowThread(fmt, NESTED, slow="<Thread>1:"))  # thread 1.1 is slow
    text = "".join(piece for _, piece in runs)
    assert text == fmt.decode(trajectory.token_ids)
    at = {piece: t for t, piece in runs}
    assert at["cccccccccc"] >= 0.2  # the slow thread 1.1
    assert at["bbbb"] >= at["cccccccccc"]  # thread 2 decoded at once, but shows only after thread 1 is done
    assert text.index("cccccccccc") < text.index("bbbb")


def test_with_an_engine_that_streams_text_shows_before_its_request_ends(fmt):
    from threadweaver.testing import StreamingScriptedEngine

    runs, trajectory = streamed(fmt, StreamingScriptedEngine(fmt, GOOD, token_delay=0.01))
    assert "".join(piece for _, piece in runs) == fmt.decode(trajectory.token_ids)
    first_request_ended = trajectory.requests[0].ended
    assert runs[0][0] < first_request_ended / 2  # the first token, long before its request's last
    pieces = [piece for _, piece in runs]
    thread_one = [at for at, piece in runs[pieces.index("<Thread>1:") : pieces.index("<Thread>2:")]]
    assert len(thread_one) == 4 and thread_one[1] < thread_one[2]  # "a", "a", "</Thread>": token by token
    thread_two = [at for at, _ in runs[pieces.index("<Thread>2:") :]]
    assert min(thread_two) >= thread_one[-1]  # decoded beside thread 1, shown after it


class Overrunning:
    """An engine of one's own that streams, and replies, its whole script: past a stop id and past
    ``max_tokens`` (the orchestrator cuts a reply as vLLM would, and the stream with it)."""

    def __init__(self, ids):
        self.ids = tuple(ids)

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        return Completion(self.ids, "stop")

    async def stream(self, prompt_ids, stop_ids, max_tokens, sampling):
        for token in self.ids:
            yield (token,)
        yield Completion(self.ids, "stop")


@pytest.mark.parametrize("past", ["a stop id", "max_tokens"])
def test_a_stream_past_what_the_reply_keeps_is_cut_as_the_reply_is(fmt, past):
    eos = min(fmt.eos_ids)
    ids = [*fmt.encode("abc"), eos, *fmt.encode("def")] if past == "a stop id" else fmt.encode("abcdefgh")
    runs = []
    limits = Limits(max_tokens=4)
    trajectory = asyncio.run(Orchestrator(Overrunning(ids), fmt, limits).run(fmt.encode(PROMPT), on_tokens=runs.append))
    assert list(trajectory.token_ids) == ids[:4]
    assert [t for run in runs for t in run] == ids[:4]
