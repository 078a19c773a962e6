"""The orchestration state machine over a scripted engine that honours the engine contract
(:class:`threadweaver.testing.ScriptedEngine`)."""

import asyncio

import pytest
from chars import EOS
from orchestrator_scripts import GOOD, HEAD, PROMPT, WELL_FORMED

from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.requests import plan_requests
from threadweaver.stats import latency_stats
from threadweaver.testing import ScriptedEngine
from threadweaver.tree import Block, parse


def decode(fmt, script, limits=Limits(), delay=0.0):
    engine = ScriptedEngine(fmt, script, delay)
    trajectory = asyncio.run(Orchestrator(engine, fmt, limits).run(fmt.encode(PROMPT)))
    return trajectory, engine


def test_a_block_forks_joins_and_matches_the_post_hoc_plan(fmt):
    t, _ = decode(fmt, GOOD)
    assert t.token_ids == tuple(fmt.encode(WELL_FORMED) + [EOS])
    assert t.degradations == () and t.finish_reason == "stop"
    nodes = parse(t.token_ids, fmt).nodes
    assert latency_stats(nodes, fmt.tags) == t.stats
    plan = plan_requests(fmt.encode(PROMPT), nodes, fmt)
    assert t.generated == plan.generated
    assert [r.completion_tokens for r in t.requests] == [len(r.completion) for r in plan.requests]
    assert [r.thread_path for r in t.requests] == [(), ((0, 1),), ((0, 2),), ()]
    assert t.stats.critical_path_tokens == len(fmt.encode("think " + HEAD)) + len("bbbb") + 1 + len(" done") + 1


def test_engine_sees_exactly_the_planned_requests(fmt):
    t, engine = decode(fmt, GOOD)
    plan = plan_requests(fmt.encode(PROMPT), parse(t.token_ids, fmt).nodes, fmt)
    assert sorted(tuple(c) for c in engine.calls) == sorted(r.context for r in plan.requests)


def test_nested_blocks_recurse(fmt):
    script = dict(GOOD)
    script["<Thread>1:"] = "x<Parallel><Outlines><Outline>1:c</Outline></Outlines>"
    script["<Thread>1:x<Parallel><Outlines><Outline>1:c</Outline></Outlines><Thread>1:"] = "cc</Thread>"
    script["<Thread>1:cc</Thread></Parallel>"] = "y</Thread>"
    t, _ = decode(fmt, script)
    assert t.degradations == ()
    parsed = parse(t.token_ids, fmt)
    assert latency_stats(parsed.nodes, fmt.tags) == t.stats
    assert t.stats.max_depth == 2 and t.stats.threads_per_block == (2, 1)


def test_branching_off_is_one_plain_request(fmt):
    script = {PROMPT: WELL_FORMED + "<EOS>"}
    t, engine = decode(fmt, script, Limits(branching=False))
    assert len(engine.calls) == 1 and t.degradations == ()
    assert t.stats.critical_path_tokens == t.stats.total_tokens == len(fmt.encode(WELL_FORMED)) + 1


def test_serial_threads_send_the_same_requests_one_after_another(fmt):
    forked, forked_engine = decode(fmt, GOOD, delay=0.01)
    serial, serial_engine = decode(fmt, GOOD, Limits(concurrent_threads=False), delay=0.01)
    assert serial.token_ids == forked.token_ids and serial.degradations == ()
    assert serial_engine.calls == sorted(forked_engine.calls, key=forked_engine.calls.index)
    threads = [r for r in serial.requests if r.thread_path]
    assert [r.thread_path for r in threads] == [((0, 1),), ((0, 2),)]
    assert threads[1].started >= threads[0].ended
    forked_threads = [r for r in forked.requests if r.thread_path]
    assert forked_threads[1].started < forked_threads[0].ended
    assert serial.stats.total_tokens == forked.stats.total_tokens
    assert serial.stats.critical_path_tokens == serial.stats.total_tokens
    assert forked.stats.critical_path_tokens == forked.stats.total_tokens - len(fmt.encode("aa</Thread>"))


@pytest.mark.parametrize(
    "head, problem",
    [
        ("<Parallel><Outlines><Outline>1:a</Outline><Outline>3:b</Outline></Outlines>", "malformed outlines"),
        ("<Parallel><Outlines></Outlines>", "malformed outlines"),
        ("<Outlines><Outline>1:a</Outline></Outlines>", "without <Parallel>"),
        ("<Parallel><Outlines><Outline>a</Outline></Outlines>", "malformed outlines"),
    ],
)
def test_malformed_outlines_degrade_to_sequential(fmt, head, problem):
    script = {PROMPT: "t " + head, head: " then plain<EOS>"}
    t, engine = decode(fmt, script)
    assert (
        len(t.degradations) == 1
        and problem in str(t.degradations[0])
        and "decoded sequentially" in str(t.degradations[0])
    )
    assert t.token_ids == tuple(fmt.encode("t " + head + " then plain") + [EOS])
    assert t.stats.blocks == 0 and t.stats.critical_path_tokens == t.stats.total_tokens
    assert len(engine.calls) == 2


def test_eos_inside_a_thread_closes_it(fmt):
    script = dict(GOOD, **{"<Thread>2:": "bb<EOS>"})
    t, _ = decode(fmt, script)
    assert len(t.degradations) == 1 and "thread 2: end-of-sequence" in str(t.degradations[0])
    parsed = parse(t.token_ids, fmt)  # strict: the structure was closed
    assert isinstance(parsed.nodes[1], Block)
    close = t.token_ids.index(fmt.tags.thread_end, t.token_ids.index(fmt.tags.thread_end) + 1)
    assert t.generated[close] is False
    assert t.stats.total_tokens == sum(t.generated)


def test_a_thread_that_never_closes_hits_the_request_limit(fmt):
    script = dict(GOOD, **{"<Thread>1:": "a" * 50})
    t, _ = decode(fmt, script, Limits(max_request_tokens=20))
    assert any("thread 1: stopped by the length limit" in p for p in map(str, t.degradations))
    parse(t.token_ids, fmt)
    assert t.stats.total_tokens == sum(t.generated)


def test_model_written_parallel_end_is_recorded(fmt):
    script = {PROMPT: "x</Parallel>y<EOS>"}
    t, _ = decode(fmt, script)
    assert any("stray </Parallel>" in p for p in map(str, t.degradations))
    assert t.token_ids == tuple(fmt.encode("x</Parallel>y") + [EOS])


def test_too_many_threads_decode_sequentially(fmt):
    script = {PROMPT: HEAD, HEAD: "<Thread>1:aa</Thread><Thread>2:b</Thread></Parallel> ok<EOS>"}
    t, _ = decode(fmt, script, Limits(max_threads=1))
    assert len(t.degradations) == 1 and "exceed max_threads=1" in str(t.degradations[0])
    assert t.token_ids == tuple(
        fmt.encode(WELL_FORMED.replace("think ", "").replace("bbbb", "b").replace(" done", " ok")) + [EOS]
    )


def test_too_deep_nesting_stays_inside_its_thread(fmt):
    """The model's own <Thread>...</Thread> in degraded text does not end the enclosing thread."""
    inner = "<Parallel><Outlines><Outline>1:c</Outline></Outlines>"
    script = dict(GOOD)
    script["<Thread>1:"] = "x" + inner
    script[inner] = "<Thread>1:cc</Thread>"
    script["<Thread>1:cc</Thread>"] = "</Parallel>y</Thread>"
    t, _ = decode(fmt, script, Limits(max_depth=1))
    assert any("over max_depth=1" in p for p in map(str, t.degradations))
    thread_one = parse(t.token_ids, fmt, strict=False, max_depth=1).nodes[1].threads[0]
    assert fmt.decode([i for n in thread_one.body for i in n.ids]).endswith("y")
    assert t.stats.max_depth == 1


def test_token_budget_ends_the_trajectory(fmt):
    t, _ = decode(fmt, GOOD, Limits(max_tokens=len(fmt.encode("think " + HEAD)) + 3))
    assert t.finish_reason == "length"
    parse(t.token_ids, fmt, strict=False)
    assert t.stats.total_tokens <= len(fmt.encode("think " + HEAD)) + 3


@pytest.mark.parametrize("concurrent", [True, False])
def test_threads_share_the_token_budget_so_no_trajectory_overruns_it(fmt, concurrent):
    """Each thread starts while the others decode: with the whole remainder each, four threads of a
    long block overran max_tokens up to fourfold (bench/serve_load.py, 2.87x)."""
    head = "<Parallel><Outlines>" + "".join(f"<Outline>{i}:x</Outline>" for i in range(1, 5)) + "</Outlines>"
    script = {"Q?": head, **{f"<Thread>{i}:": "y" * 50 + "</Thread>" for i in range(1, 5)}, "</Parallel>": "z<EOS>"}
    budget = len(fmt.encode(head)) + 40
    t, _ = decode(fmt, script, Limits(max_tokens=budget, concurrent_threads=concurrent))
    assert sum(r.completion_tokens for r in t.requests) <= budget
    shares = [r.completion_tokens for r in t.requests if r.thread_path]
    assert shares == [10, 10, 10, 10]  # what was left after the head, split four ways
    assert t.degradation_kinds == {"closed_by_limit"} and t.finish_reason == "length"


def test_deadline_closes_everything(fmt):
    t, _ = decode(fmt, GOOD, Limits(timeout_s=0.05), delay=0.03)
    assert t.finish_reason == "timeout"
    assert t.degradations and all("timeout" in p for p in map(str, t.degradations))
    # closed structure: at worst some threads are empty
    assert all("is empty" in p.message for p in parse(t.token_ids, fmt, strict=False).faults)


class FailingEngine(ScriptedEngine):
    """The scripted engine, but the request whose context ends with ``fail_after`` raises."""

    def __init__(self, fmt, script, fail_after: str):
        super().__init__(fmt, script)
        self.fail_after = fail_after

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        if self.fmt.decode(prompt_ids).endswith(self.fail_after):
            raise ConnectionError("server went away")
        return await super().generate(prompt_ids, stop_ids, max_tokens, sampling)


def test_an_engine_error_raises_by_default(fmt):
    engine = FailingEngine(fmt, GOOD, "<Thread>2:")
    with pytest.raises(ConnectionError, match="server went away"):
        asyncio.run(Orchestrator(engine, fmt).run(fmt.encode(PROMPT)))


def test_an_engine_error_in_a_thread_degrades_when_asked(fmt):
    engine = FailingEngine(fmt, GOOD, "<Thread>2:")
    t = asyncio.run(Orchestrator(engine, fmt, degrade_on_engine_error=True).run(fmt.encode(PROMPT)))
    assert tuple(map(str, t.degradations)) == (
        "thread 2: the engine failed (ConnectionError: server went away); the sequence stopped there",
        "thread 2: closed after the engine error",
    )
    assert t.finish_reason == "stop"  # the main sequence went on after the join
    assert t.token_ids == tuple(
        fmt.encode("think " + HEAD + "<Thread>1:aa</Thread><Thread>2:</Thread></Parallel> done") + [EOS]
    )
    assert t.stats.total_tokens == sum(t.generated)  # the injected </Thread> is not counted
    assert ((0, 2),) in t.closed_threads


def test_an_engine_error_in_the_main_sequence_ends_the_trajectory(fmt):
    engine = FailingEngine(fmt, GOOD, "</Parallel>")
    t = asyncio.run(Orchestrator(engine, fmt, degrade_on_engine_error=True).run(fmt.encode(PROMPT)))
    assert t.finish_reason == "error"
    assert tuple(map(str, t.degradations)) == (
        "main sequence: the engine failed (ConnectionError: server went away); the sequence stopped there",
    )
    assert t.token_ids == tuple(fmt.encode(WELL_FORMED.removesuffix(" done")))


def test_max_requests_ends_the_trajectory_as_a_token_limit_would(fmt):
    """GOOD makes 4 requests (head, two threads, continuation); at 2 the second thread cannot start."""
    t, engine = decode(fmt, GOOD, Limits(max_requests=2))
    assert len(t.requests) == len(engine.calls) == 2
    assert "thread 2: stopped by the max_requests limit; the thread was closed" in map(str, t.degradations)
    assert t.finish_reason == "length" and (0, 2) in {p[-1] for p in t.closed_threads}
    assert isinstance(parse(t.token_ids, fmt, strict=False).nodes[1], Block)  # the block was closed


class Counting(ScriptedEngine):
    """A scripted engine that records the most requests it ever had in flight."""

    def __init__(self, *args):
        super().__init__(*args)
        self.now = self.most = 0

    async def generate(self, *args):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            return await super().generate(*args)
        finally:
            self.now -= 1


@pytest.mark.parametrize("inflight, most", [(64, 2), (1, 1)])
def test_max_concurrent_requests_bounds_one_trajectorys_requests_in_flight(fmt, inflight, most):
    engine = Counting(fmt, GOOD, 0.02)
    t = asyncio.run(Orchestrator(engine, fmt, Limits(max_concurrent_requests=inflight)).run(fmt.encode(PROMPT)))
    assert engine.most == most
    assert t.token_ids == tuple(fmt.encode(WELL_FORMED) + [EOS]) and not t.degradations


@pytest.mark.parametrize(
    "field, value",
    [("max_threads", -5), ("max_threads", 0), ("max_depth", 0), ("max_tokens", -1), ("max_request_tokens", 0)]
    + [
        ("max_requests", 0),
        ("max_concurrent_requests", 0),
        ("max_tokens", 2.5),
        ("max_tokens", True),
        ("timeout_s", -1.0),
        ("branching", "no"),
        ("concurrent_threads", 0),
        ("warm_join", None),
    ],
)
def test_limits_out_of_range_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        Limits(**{field: value})


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("What is 2+2?", "prompt_ids must be a list of token ids, not str (tokenizer.encode(text), or"),
        ({"input_ids": [1, 2], "attention_mask": [1, 1]}, "prompt_ids must be a list of token ids, not dict"),
        ([[1, 2]], "prompt_ids must be a list of token ids (ints), but it holds [1, 2]"),
        ([1, 2.5], "prompt_ids must be a list of token ids (ints), but it holds 2.5"),
    ],
)
def test_a_prompt_that_is_not_token_ids_is_refused_before_any_request(fmt, prompt, message):
    """An HTTP engine would send a BatchEncoding's keys as two text prompts and decode garbage."""
    engine = ScriptedEngine(fmt, GOOD)
    with pytest.raises(TypeError) as refused:
        asyncio.run(Orchestrator(engine, fmt).run(prompt))
    assert str(refused.value).startswith(message) and not engine.calls


def test_a_negative_token_id_is_refused_naming_its_position(fmt):
    engine = ScriptedEngine(fmt, GOOD)
    with pytest.raises(ValueError, match=r"^prompt_ids holds -1 at position 1: token ids are 0 or more$"):
        asyncio.run(Orchestrator(engine, fmt).run([5, -1]))
    assert not engine.calls
