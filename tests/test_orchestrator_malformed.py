"""A table of bad model outputs driven through the orchestrator with a scripted engine.

Each must end in a closed trajectory (every block has one closed thread per outline,
the tree renders to the token ids, the stats count what the model generated) and a
recorded problem that says what happened. None may raise.
"""

import asyncio

import pytest
from orchestrator_scripts import CASES, PROMPT
from trees import all_blocks

from threadweaver.orchestrator import Orchestrator
from threadweaver.testing import ScriptedEngine
from threadweaver.tree import Block, Text, render


@pytest.mark.parametrize("script, limits, problem", CASES.values(), ids=CASES.keys())
def test_bad_output_ends_closed_with_a_recorded_problem(fmt, script, limits, problem):
    engine = ScriptedEngine(fmt, script)
    t = asyncio.run(Orchestrator(engine, fmt, limits).run(fmt.encode(PROMPT)))
    assert any(problem in p for p in t.faults), t.faults
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
