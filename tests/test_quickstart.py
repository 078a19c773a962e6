"""The quickstart's pure parts: critical paths of request timelines, the comparison table, the page."""

import asyncio
import dataclasses
import re

import pytest
from orchestrator_scripts import GOOD, NESTED, PROMPT

from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.quickstart.compare import Problem, format_table, per_problem_speedups, problems, table
from threadweaver.quickstart.timeline import Timeline, critical_requests, page
from threadweaver.testing import ScriptedEngine


def decoded_row(fmt, script, limits=Limits()):
    trajectory = asyncio.run(Orchestrator(ScriptedEngine(fmt, script), fmt, limits).run(fmt.encode(PROMPT)))
    return {
        "requests": [dataclasses.asdict(r) for r in trajectory.requests],
        "stats": trajectory.stats.as_dict(),
        "wall_s": 0.5,
        "tree": [],
    }, trajectory


@pytest.mark.parametrize("script", [GOOD, NESTED], ids=["flat", "nested"])
def test_critical_path_of_the_requests_is_the_orchestrators_token_latency(fmt, script):
    row, trajectory = decoded_row(fmt, script)
    tokens, marked = critical_requests(row["requests"])
    assert tokens == trajectory.stats.critical_path_tokens
    assert tokens < trajectory.stats.total_tokens
    paths = {tuple(map(tuple, row["requests"][i]["thread_path"])) for i in marked}
    if script is GOOD:  # thread 2 ("bbbb") outlasts thread 1 ("aa")
        assert paths == {(), ((0, 2),)}
    else:  # thread 1 with its nested block outlasts thread 2; inside it, thread 1.1 outlasts 1.2
        assert trajectory.stats.max_depth == 2
        assert paths == {(), ((0, 1),), ((0, 1), (0, 1))}


def test_page_marks_the_critical_path_and_every_request_of_a_serial_run(fmt):
    forked, _ = decoded_row(fmt, NESTED)
    serial, _ = decoded_row(fmt, NESTED, Limits(concurrent_threads=False))
    html = page(
        [("problem 0", [Timeline("fork-join", forked), Timeline("one after another", serial, concurrent=False)])],
        "timelines",
        "intro",
    )
    svgs = re.findall(r"<svg class=\"timeline\".*?</svg>", html)
    assert len(svgs) == 2
    assert svgs[0].count('class="request critical"') == len(critical_requests(forked["requests"])[1])
    assert svgs[0].count('class="request"') == len(forked["requests"]) - svgs[0].count('class="request critical"')
    assert svgs[1].count('class="request critical"') == len(serial["requests"])
    lanes = re.findall(r'<text class="lane"[^>]*>([^<]*)</text>', svgs[0])
    assert lanes == ["main", "thread 1", "thread 1.1", "thread 1.2", "thread 2"]


def problem(doc, acc, tokens, latency, wall):
    return Problem(doc, acc, 1.0, latency, tokens, wall)


def test_table_speedups_are_ratios_of_means_against_the_reference():
    runs = {
        "fork_join": {0: problem(0, 1.0, 300, 200, 1.0), 1: problem(1, 0.0, 500, 300, 2.0)},
        "baseline": {0: problem(0, 1.0, 400, 400, 2.0), 1: problem(1, 1.0, 600, 600, 4.0), 2: problem(2, 1, 9, 9, 9)},
    }
    rows = table(runs, {"fork_join": "fj", "baseline": "base"}, "baseline")
    fj, base = rows
    assert fj.acc == 0.5 and base.acc == 1.0  # doc 2 is not shared and is left out
    assert fj.token_speedup == pytest.approx(500 / 250) and fj.wall_speedup == pytest.approx(3.0 / 1.5)
    assert base.token_speedup == base.wall_speedup == 1.0
    speedups = per_problem_speedups(runs["fork_join"], runs["baseline"])
    assert speedups == {"tokens": [2.0, 2.0], "wall": [2.0, 2.0]}
    text = format_table(rows, "base")
    assert "| fj  " in text and "2.00x" in text and "50.0%" in text


def test_problems_join_samples_to_trajectories_by_prompt():
    samples = [
        {
            "doc_id": 3,
            "arguments": {"gen_args_0": {"arg_0": "Q3"}},
            "acc": 1.0,
            "format_valid": 1.0,
            "token_latency": 10,
            "total_tokens": 12,
        }
    ]
    rows = [{"context": "Q3", "wall_s": 1.0}, {"context": "Q3", "wall_s": 3.0}, {"context": "other", "wall_s": 9}]
    [(doc, result)] = problems(samples, rows).items()
    assert doc == 3 and result.wall_s == 2.0 and len(result.trajectories) == 2
    with pytest.raises(ValueError, match="doc 3: no trajectory"):
        problems(samples, rows[2:])
