"""``threadweaver stats`` reads an orchestrator's row as it decoded it: the same statistics and faults."""

import asyncio
import json

import pytest
from orchestrator_scripts import CASES, GOOD, NESTED, PROMPT

from threadweaver.batch import trajectory_row
from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.report import file_stats
from threadweaver.rows import RowReader
from threadweaver.testing import ScriptedEngine

SCRIPTS = {
    "well-formed": (GOOD, Limits()),
    "nested": (NESTED, Limits()),
    "nested, threads one after another": (NESTED, Limits(concurrent_threads=False)),
    **{name: (script, limits) for name, (script, limits, _) in CASES.items()},
}


@pytest.mark.parametrize("script, limits", SCRIPTS.values(), ids=SCRIPTS.keys())
def test_stats_of_a_generated_row_are_the_ones_the_orchestrator_recorded(fmt, tmp_path, script, limits):
    t = asyncio.run(Orchestrator(ScriptedEngine(fmt, script), fmt, limits).run(fmt.encode(PROMPT)))
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps(trajectory_row(t, fmt, 0.0, limits, id="r", sample=0)) + "\n")
    (row,) = file_stats(str(path), RowReader(None, fmt))
    assert row.stats == t.stats
    assert row.faults == tuple(map(str, t.degradations))


def test_text_rows_are_parsed_and_show_the_parse_faults(fmt, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "r", "text": "x</Parallel>y"}) + "\n")
    (row,) = file_stats(str(path), RowReader(None, fmt))
    assert row.stats.total_tokens == 3 and len(row.faults) == 1 and "token 1 (</Parallel>)" in row.faults[0]
