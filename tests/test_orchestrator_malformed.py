"""A table of bad model outputs driven through the orchestrator with a scripted engine.

Each must end in a closed trajectory (every block has one closed thread per outline,
the tree renders to the token ids, the stats count what the model generated) and a
recorded problem that says what happened. None may raise.
"""

import asyncio

import pytest
from orchestrator_scripts import CASES, PROMPT
from trees import all_blocks

from threadweaver.layout import render
from threadweaver.orchestrator import DEGRADATION_KINDS, Orchestrator
from threadweaver.testing import ScriptedEngine
from threadweaver.tree import Block, Text


@pytest.mark.parametrize("script, limits, problem", CASES.values(), ids=CASES.keys())
def test_bad_output_ends_closed_with_a_recorded_problem(fmt, script, limits, problem):
    engine = ScriptedEngine(fmt, script)
    t = asyncio.run(Orchestrator(engine, fmt, limits).run(fmt.encode(PROMPT)))
    assert any(problem in p for p in map(str, t.degradations)), t.degradations
    assert render(t.nodes, fmt) == list(t.token_ids)
    for block in all_blocks(t.nodes):
        assert [th.number for th in block.threads] == [o.number for o in block.outlines]
    assert len(t.generated) == len(t.token_ids)
    assert t.stats.total_tokens == sum(t.generated)
    assert t.stats.critical_path_tokens <= t.stats.total_tokens
    assert t.stats.total_tokens <= sum(r.completion_tokens for r in t.requests)  # a dropped EOS was generated
    assert all(isinstance(n, (Text, Block)) for n in t.nodes)


def test_the_table_is_long_enough():
    assert len(CASES) >= 25


@pytest.mark.parametrize("script, limits, problem", CASES.values(), ids=CASES.keys())
def test_each_degradation_has_a_kind_and_the_trajectory_position_it_is_about(fmt, script, limits, problem):
    t = asyncio.run(Orchestrator(ScriptedEngine(fmt, script), fmt, limits).run(fmt.encode(PROMPT)))
    tags = fmt.tags
    for d in t.degradations:
        assert d.kind in DEGRADATION_KINDS and str(d).endswith(d.detail)
        at = t.token_ids[d.position] if d.position < len(t.token_ids) else None
        if d.kind == "empty_thread":
            assert at == tags.thread_end
        elif d.kind in ("eos_in_thread", "closed_by_limit") or d.detail.startswith("closed after"):
            assert at == tags.thread_end and not t.generated[d.position]  # the </Thread> the orchestrator put there
        elif d.kind == "stray_tag":
            assert fmt.tag_name(at) in d.detail
        elif d.kind in ("too_many_threads", "too_deep"):
            assert at == tags.parallel
        elif d.kind == "bad_outlines" and "without <Parallel>" in d.detail:
            assert at == tags.outlines_end
        elif d.kind == "bad_outlines":
            assert f"token {d.position} " in d.detail or f"token {d.position}:" in d.detail
            tag = d.detail.split("(")[2].split(")")[0] if at is not None and fmt.tag_name(at) else None
            assert tag is None or fmt.tag_name(at) == tag
