"""Batch decoding: prompts from problem rows, JSONL out, resume after a crash."""

import asyncio
import json

import pytest
from orchestrator_scripts import GOOD, PROMPT, WELL_FORMED

from threadweaver.batch import Job, problem_jobs, read_problems, run_batch
from threadweaver.jsonl import RowError, finished_keys
from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.rows import RowReader
from threadweaver.testing import ScriptedEngine
from threadweaver.tree import tree_json


class ChatTokenizer:
    """Enough of a transformers tokenizer: a chat template that joins the turns."""

    chat_template = "joined"

    def __init__(self, fmt):
        self.fmt = fmt

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert not tokenize and add_generation_prompt
        return "".join(m["content"] for m in messages)

    def encode(self, text, add_special_tokens):
        return self.fmt.encode(text)


def prompt_ids(row, tokenizer):
    return RowReader(tokenizer).prompt(row)


def test_prompts_from_each_row_shape(fmt):
    tok = ChatTokenizer(fmt)
    assert prompt_ids({"prompt_ids": [1, 2]}, tok) == [1, 2]
    assert prompt_ids({"prompt": "Q?"}, tok) == fmt.encode("Q?")
    solved = {"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A"}]}
    assert prompt_ids(solved, tok) == fmt.encode("Q?")
    for bad, field in [
        ({"prompt_ids": []}, "prompt_ids"),
        ({"messages": "Q"}, "messages"),
        ({"prompt": 3}, "prompt"),
        ({"question": "Q"}, "no prompt"),
    ]:
        with pytest.raises(ValueError, match=field):
            prompt_ids(bad, tok)


def test_bad_rows_and_duplicate_ids_name_the_line(fmt, tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "Q?"}) + "\n" + json.dumps({"id": "b"}) + "\n")
    with pytest.raises(RowError, match="line 2: no prompt"):
        list(problem_jobs(read_problems(str(path)), ChatTokenizer(fmt), 1))
    path.write_text(json.dumps({"id": "a", "prompt": "Q?"}) + "\n" + json.dumps({"id": "a", "prompt": "R"}) + "\n")
    with pytest.raises(RowError, match="line 2: duplicate id 'a'"):
        list(problem_jobs(read_problems(str(path)), ChatTokenizer(fmt), 1))


def test_rows_are_written_as_they_finish_and_resume_skips_them(fmt, tmp_path):
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"id": f"p{i}", "prompt": PROMPT, "answer": "42"}) + "\n" for i in range(3)))
    out = tmp_path / "out.jsonl"
    jobs = list(problem_jobs(read_problems(str(problems)), ChatTokenizer(fmt), 2))
    orchestrator = Orchestrator(ScriptedEngine(fmt, GOOD), fmt)
    progress = asyncio.run(run_batch(jobs[:4], orchestrator, str(out), concurrency=2))
    assert progress.done == 4 and progress.mean_speedup > 1 and progress.cut_short() == ""
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["text"] == fmt.decode(fmt.encode(WELL_FORMED) + [999])
    assert rows[0]["answer"] == "42" and rows[0]["degradations"] == []
    assert rows[0]["tree"][1]["outlines"] == ["1:a", "2:b"]
    assert [r["thread_path"] for r in rows[0]["requests"]] == [[], [[0, 1]], [[0, 2]], []]
    assert rows[0]["stats"]["critical_path_tokens"] < rows[0]["stats"]["total_tokens"]
    # a crash mid-write leaves a torn last line: it is cut off and that row is redone
    with open(out, "a") as f:
        f.write('{"id": "p2", "sample"')
    done, _ = finished_keys(str(out))
    assert done == {("p0", 0), ("p0", 1), ("p1", 0), ("p1", 1)}
    assert out.read_text().endswith("}\n")
    todo = [j for j in jobs if (j.row_id, j.sample) not in done]
    asyncio.run(run_batch(todo, orchestrator, str(out), concurrency=2))
    keys = [(r["id"], r["sample"]) for r in map(json.loads, out.read_text().splitlines())]
    assert sorted(keys) == sorted({(j.row_id, j.sample) for j in jobs})


class FailingEngine(ScriptedEngine):
    """Serves the first trajectory, then the server is gone."""

    async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
        if self.fmt.decode(prompt_ids).startswith("bad"):
            await asyncio.sleep(0.01)
            raise ConnectionError("server gone")
        return await super().generate(prompt_ids, stop_ids, max_tokens, sampling)


def test_an_engine_error_keeps_every_finished_row(fmt, tmp_path):
    out = tmp_path / "out.jsonl"
    jobs = [Job("good", 0, tuple(fmt.encode(PROMPT)), {}), Job("bad", 0, tuple(fmt.encode("bad" + PROMPT)), {})]
    with pytest.raises(ConnectionError):
        asyncio.run(run_batch(jobs, Orchestrator(FailingEngine(fmt, GOOD), fmt), str(out), concurrency=2))
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["good"]


def test_sample_seeds_differ_per_sample(fmt, tmp_path):
    seen = []

    class SeedEngine(ScriptedEngine):
        async def generate(self, prompt_ids, stop_ids, max_tokens, sampling):
            seen.append(sampling.seed)
            return await super().generate(prompt_ids, stop_ids, max_tokens, sampling)

    jobs = [Job("p", k, tuple(fmt.encode(PROMPT)), {}) for k in range(3)]
    asyncio.run(
        run_batch(jobs, Orchestrator(SeedEngine(fmt, GOOD), fmt), str(tmp_path / "o.jsonl"), concurrency=3, seed=10)
    )
    assert sorted(set(seen)) == [10, 11, 12]


def test_tree_json_nests_threads(fmt):
    from threadweaver.tree import parse

    nodes = parse(fmt.encode(WELL_FORMED), fmt).nodes
    assert tree_json(nodes, fmt) == [
        {"text": "think "},
        {
            "outlines": ["1:a", "2:b"],
            "threads": [{"number": 1, "body": [{"text": "aa"}]}, {"number": 2, "body": [{"text": "bbbb"}]}],
        },
        {"text": " done"},
    ]


def test_trajectories_cut_short_are_counted_by_their_finish_reason(fmt, tmp_path):
    jobs = [Job(f"p{i}", 0, tuple(fmt.encode(PROMPT)), {}) for i in range(2)]
    orchestrator = Orchestrator(ScriptedEngine(fmt, GOOD), fmt, Limits(max_tokens=3))
    progress = asyncio.run(run_batch(jobs, orchestrator, str(tmp_path / "o.jsonl"), concurrency=2))
    assert progress.done == 2 and progress.cut_short() == "2 cut short (finish_reason length 2)"
