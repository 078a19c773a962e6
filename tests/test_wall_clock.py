"""A trajectory's wall-clock cut into phases (threadweaver.wall_clock) that add up to it."""

import asyncio
import json

import pytest
from orchestrator_scripts import CASES, GOOD, NESTED, PROMPT

from threadweaver.jsonl import RowError
from threadweaver.orchestrator import Orchestrator, RequestRecord
from threadweaver.testing import ScriptedEngine, StreamingScriptedEngine
from threadweaver.wall_clock import BlockTime, WallClock, phases, wall_clock


def record(path, started, ended, tokens, first=None):
    return RequestRecord(path, 10, tokens, "stop", started, ended, None, first)


def test_the_phases_of_one_block():
    requests = [
        record((), 0.0, 1.0, 10, first=0.2),  # 4 of its 10 tokens are the head
        record(((0, 1),), 1.1, 3.0, 30),
        record(((0, 2),), 1.1, 2.0, 9),
        record((), 3.05, 4.0, 5, first=3.5),
    ]
    got = phases(requests, heads=[4])
    expected = WallClock(
        total_s=4.0,
        prefill_s=0.2,
        sequential_s=0.8 * 6 / 10 + 0.5,
        heads_s=0.8 * 4 / 10,
        threads_s=1.9,
        join_s=0.45,
        client_s=0.1 + 0.05,
        timed=True,
        blocks=(BlockTime(head_s=0.32, threads_s=1.9, join_s=0.45),),
    )
    for name in ("total_s", *WallClock.PARTS):
        assert getattr(got, name) == pytest.approx(getattr(expected, name)), name
    assert got.blocks[0].head_s == pytest.approx(0.32) and got.blocks[0].join_s == pytest.approx(0.45)
    assert got.timed


def test_a_request_cut_by_its_token_limit_is_not_a_head():
    """Two main-sequence requests before the block: only the second wrote its head."""
    requests = [
        record((), 0.0, 1.0, 8),
        record((), 1.0, 2.0, 8),
        record(((0, 1),), 2.0, 3.0, 5),
        record((), 3.0, 3.5, 2),
    ]
    got = phases(requests, heads=[4])
    assert got.heads_s == pytest.approx(0.5) and got.sequential_s == pytest.approx(1.5 + 0.5)
    assert not got.timed and got.prefill_s == got.join_s == 0.0


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_parts_add_up_for_every_script(fmt, case):
    script, limits, _ = CASES[case]
    engine = StreamingScriptedEngine(fmt, script, token_delay=0.001)
    trajectory = asyncio.run(Orchestrator(engine, fmt, limits).run(fmt.encode(PROMPT), on_tokens=lambda ids: None))
    got = wall_clock(trajectory)
    assert sum(getattr(got, name) for name in WallClock.PARTS) == pytest.approx(got.total_s)
    assert got.total_s == pytest.approx(max(r.ended for r in trajectory.requests))
    assert min(getattr(got, name) for name in WallClock.PARTS) >= 0


@pytest.mark.parametrize("script", [GOOD, NESTED], ids=["one block", "nested"])
def test_streamed_requests_have_their_first_token_times(fmt, script):
    engine = StreamingScriptedEngine(fmt, script, token_delay=0.005)
    trajectory = asyncio.run(Orchestrator(engine, fmt).run(fmt.encode(PROMPT), on_tokens=lambda ids: None))
    for r in trajectory.requests:
        assert r.started < r.first_token <= r.ended
    got = wall_clock(trajectory)
    assert got.timed and len(got.blocks) == 1 and got.threads_s > 0 and got.heads_s > 0


def test_without_first_token_times_the_waits_count_as_decoding(fmt):
    trajectory = asyncio.run(Orchestrator(ScriptedEngine(fmt, GOOD, delay=0.01), fmt).run(fmt.encode(PROMPT)))
    got = wall_clock(trajectory)
    assert not got.timed and got.prefill_s == got.join_s == 0.0 and got.sequential_s > 0


def test_stats_prints_the_mean_of_the_recorded_phases(fmt, tmp_path):
    from threadweaver.batch import trajectory_row
    from threadweaver.report import file_stats, format_summary, summary
    from threadweaver.rows import RowReader

    engine = StreamingScriptedEngine(fmt, GOOD, token_delay=0.002)
    rows, clocks = [], []
    for _ in range(2):
        t = asyncio.run(Orchestrator(engine, fmt).run(fmt.encode(PROMPT), on_tokens=lambda ids: None))
        rows.append(trajectory_row(t, fmt, 0.0, Orchestrator(engine, fmt).limits, id="r", sample=0))
        clocks.append(wall_clock(t))
    path = tmp_path / "out.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    means = summary(file_stats(str(path), RowReader(None, fmt)))["mean_wall_clock"]
    assert means["threads_s"] == pytest.approx((clocks[0].threads_s + clocks[1].threads_s) / 2)
    assert means["total_s"] == pytest.approx(sum(means[name] for name in WallClock.PARTS))
    line = format_summary(summary(file_stats(str(path), RowReader(None, fmt)))).splitlines()[-1]
    assert line.startswith("mean wall-clock") and f"threads {means['threads_s']:.2f}" in line

    for bad in ({"total_s": "soon"}, {**clocks[1].as_dict(), "threads_s": float("nan")}):
        rows[1]["wall_clock"] = bad
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(RowError, match="'wall_clock' must hold the finite numbers total_s, prefill_s") as caught:
            list(file_stats(str(path), RowReader(None, fmt)))
        assert caught.value.line == 2
