"""``threadweaver curate`` against a stand-in LLM server on loopback that knows the synthetic task.

The synthetic task has a sequential and a parallel form of every problem: given the right
structured answers, curate must rebuild the parallel form exactly from the sequential one. Faults in
the replies and in the transport each end in their reason code, and nothing crashes.
"""

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from contextlib import closing
from dataclasses import replace

import pytest
from llm_stand_in import StandIn, stand_in_server

from threadweaver.cli import main
from threadweaver.curate import pipeline, prompts
from threadweaver.curate.blocks import Block, Refused, apply_edits, assemble, extract, with_outlines
from threadweaver.curate.calls import CallCache
from threadweaver.curate.config import CurateArgs, CurateConfig, LLMArgs
from threadweaver.curate.run import run, target_reader
from threadweaver.curate.schemas import (
    MOST_UNITS,
    Edit,
    ProposedBlock,
    Segmentation,
    Span,
    json_schema,
    segmentation_schema,
)
from threadweaver.curate.traces import split_units, to_trace
from threadweaver.jsonl import read_jsonl, write_jsonl
from threadweaver.synth import chat_row, make_rows
from threadweaver.testing import CLI

FAST = LLMArgs(model="stand-in", retries=1, timeout_s=10.0, concurrency=8)
"""Generous timeouts: a loaded CI machine must not turn a slow reply into a ``timeout`` drop."""


def curate(tmp_path, rows, stand_in, name="out", llm=FAST, **config):
    traces = tmp_path / "sequential.jsonl"
    if not traces.exists():
        write_jsonl(str(traces), rows)
    out = tmp_path / name
    with stand_in_server(stand_in) as url:
        stats = run(
            CurateArgs(str(traces), str(out), tokenizer="synth"), replace(llm, base_url=url), CurateConfig(**config)
        )
    kept = {row["id"]: row for _, row in read_jsonl(str(out / "train.jsonl"))}
    dropped = [row for _, row in read_jsonl(str(out / "dropped.jsonl"))]
    return stats, kept, dropped


def sequential_rows(n, seed=0):
    rows = make_rows(n, seed)
    return rows, [chat_row(r, "sequential") for r in rows]


def test_curate_rebuilds_the_parallel_form_of_200_problems_token_for_token(tmp_path):
    rows, sequential = sequential_rows(200)
    stats, kept, dropped = curate(tmp_path, sequential, StandIn())
    fmt = target_reader("synth").fmt
    same = [
        r["id"]
        for r in rows
        if r["id"] in kept and fmt.encode(kept[r["id"]]["messages"][1]["content"]) == fmt.encode(r["parallel"])
    ]
    assert len(same) >= 198, dropped[:3]
    assert stats["kept"] == len(kept) and stats["traces"] == 200
    assert stats["funnel"]["traces"]["verify"] == len(kept)
    assert kept[rows[0]["id"]]["messages"][0]["content"] == rows[0]["prompt"]
    assert kept[rows[0]["id"]]["answer"] == rows[0]["answer"]
    assert stats["tokens"]["segment"]["calls"] == 200 and stats["speedup"]["min"] > 1.3


@pytest.mark.parametrize(
    "fault, stage, reasons",
    [
        ("off_by_one", "extract", {"thread_gap", "no_block"}),
        ("overlap", "extract", {"thread_overlap", "no_block"}),
        ("one_thread", "segment", {"schema_invalid"}),
        ("edit_absent", "decouple", {"edit_absent", "no_block"}),
        ("edit_ambiguous", "decouple", {"edit_ambiguous", "no_block"}),
        ("outline_count", "outline", {"outline_count", "no_block"}),
        ("bad_json", "segment", {"invalid_json"}),
        ("truncated", "outline", {"truncated", "no_block"}),
        ("429", "segment", {"rate_limited"}),
        ("500", "segment", {"server_error"}),
        ("timeout", "segment", {"timeout"}),
        ("web_page", "segment", {"server_error"}),  # was an AttributeError, as an unexpected fault
        ("refusal", "segment", {"refused"}),  # was invalid_json, the refusal's text lost
    ],
)
def test_each_fault_ends_in_its_reason_and_the_other_traces_go_on(tmp_path, fault, stage, reasons):
    rows, sequential = sequential_rows(4)
    stand_in = StandIn({rows[1]["prompt"]: fault})
    llm = replace(FAST, timeout_s=1.0) if fault == "timeout" else FAST  # the stand-in sleeps 3 s
    stats, kept, dropped = curate(tmp_path, sequential, stand_in, llm=llm)
    assert set(kept) == {rows[i]["id"] for i in (0, 2, 3)}
    mine = [d for d in dropped if d["id"] == rows[1]["id"]]
    assert {d["reason"] for d in mine} == reasons and {d["stage"] for d in mine} == {stage}
    assert all(d["detail"] and d["line"] == 2 for d in mine)
    assert stats["dropped"][stage] == {r: 1 for r in reasons}
    assert stats["funnel"]["traces"]["ingest"] == 4 and stats["kept"] == 3


def test_a_refused_reply_is_asked_again_with_the_reason_and_a_429_is_retried(tmp_path):
    rows, sequential = sequential_rows(3)
    stand_in = StandIn({rows[0]["prompt"]: "edit_absent", rows[2]["prompt"]: "429_once"})
    _, kept, dropped = curate(tmp_path, sequential, stand_in)
    assert stand_in.answered["decouple"] == 3 + 1  # one re-ask for the refused edit
    assert rows[2]["id"] in kept  # the 429 was retried
    (absent,) = [d for d in dropped if d["reason"] == "edit_absent"]
    assert "occurs 0 times in thread 2" in absent["detail"]


def test_a_rerun_pays_for_nothing_and_a_changed_prompt_reruns_its_stage_only(tmp_path, monkeypatch):
    _, sequential = sequential_rows(6)
    stand_in = StandIn()
    first, kept, _ = curate(tmp_path, sequential, stand_in)
    assert sum(stand_in.answered.values()) == 18
    again, kept_again, _ = curate(tmp_path, sequential, stand_in)
    assert sum(stand_in.answered.values()) == 18 and kept_again == kept
    assert again["tokens"]["segment"] == {**first["tokens"]["segment"], "calls": 0, "cache_hits": 6} | {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost_usd": 0.0,
    }
    monkeypatch.setattr(prompts, "OUTLINE", prompts.OUTLINE + " Be brief.")
    curate(tmp_path, sequential, stand_in)
    assert stand_in.answered == {"segment": 6, "decouple": 6, "outline": 12}


def test_the_report_accounts_for_every_row_including_bad_ones(tmp_path, capsys):
    rows, sequential = sequential_rows(3)
    wrong = {**sequential[2], "answer": "1"}
    short = {"id": "short", "problem": "1+1", "response": "<think>\nit is 2\n</think>\n\\boxed{2}", "answer": "2"}
    path = tmp_path / "sequential.jsonl"
    write_jsonl(str(path), [sequential[0], {"id": "no-answer", "messages": sequential[1]["messages"]}, wrong, short])
    with open(path, "a") as f:
        f.write("{not json\n")
    stats, kept, dropped = curate(tmp_path, None, StandIn(), price_prompt=2.0, price_completion=8.0)
    assert set(kept) == {rows[0]["id"]}
    by_line = {d["line"]: (d["stage"], d["reason"]) for d in dropped}
    assert by_line == {
        2: ("ingest", "unreadable"),
        3: ("ingest", "wrong_answer"),
        4: ("ingest", "too_few_units"),
        5: ("ingest", "unreadable"),
    }
    assert "line 2: no gold answer" in next(d["detail"] for d in dropped if d["line"] == 2)
    said = capsys.readouterr().err  # the unreadable lines named before any call: no need to open dropped.jsonl
    assert f"threadweaver curate: {path}: 2 unreadable lines dropped (the first: line 2: no gold answer" in said
    assert stats["traces"] == 5 and stats["funnel"]["traces"]["ingest"] == 1
    used = stats["tokens"]["segment"]
    assert used["cost_usd"] == pytest.approx((used["prompt_tokens"] * 2 + used["completion_tokens"] * 8) / 1e6)
    assert stats["cost_usd"] > 0


def test_a_repeated_trace_is_rewritten_and_paid_for_once(tmp_path):
    rows, sequential = sequential_rows(2)
    stand_in = StandIn()
    renamed = {**sequential[0], "id": "again"}  # another id, the same prompt and response
    stats, kept, dropped = curate(tmp_path, [sequential[0], sequential[1], sequential[0], renamed], stand_in)
    assert set(kept) == {rows[0]["id"], rows[1]["id"]} and stand_in.answered["segment"] == 2
    assert [(d["line"], d["stage"], d["reason"], d["detail"]) for d in dropped] == [
        (line, "ingest", "duplicate", "the same prompt and response as line 1") for line in (3, 4)
    ]


def test_an_unexpected_fault_ends_its_trace_not_the_run(tmp_path, monkeypatch):
    rows, sequential = sequential_rows(2)

    def broken(trace, blocks):
        if trace.id == rows[0]["id"]:
            raise KeyError("boom")
        return assemble(trace, blocks)

    monkeypatch.setattr(pipeline, "assemble", broken)
    stats, kept, dropped = curate(tmp_path, sequential, StandIn())
    assert set(kept) == {rows[1]["id"]}
    assert [(d["stage"], d["reason"], d["detail"]) for d in dropped] == [("verify", "error", "KeyError: 'boom'")]


def test_replies_that_are_no_completion_or_a_refusal_say_what_they_are(tmp_path):
    rows, sequential = sequential_rows(3)
    stand_in = StandIn({rows[0]["prompt"]: "web_page", rows[1]["prompt"]: "refusal"})
    _, _, dropped = curate(tmp_path, sequential, stand_in)
    page, refusal = (next(d["detail"] for d in dropped if d["id"] == rows[i]["id"]) for i in (0, 1))
    assert page.endswith(
        "/v1/: the reply is not a chat completion: '<!doctype html><title>Welcome</title><p>It works!'"
    )
    assert refusal == "the model refused: I can't help with that."


def test_a_401_without_a_key_says_that_none_was_given(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    rows, sequential = sequential_rows(2)
    _, _, dropped = curate(tmp_path, sequential, StandIn({rows[0]["prompt"]: "401"}))
    (refused,) = [d for d in dropped if d["id"] == rows[0]["id"]]
    assert refused["reason"] == "refused" and refused["detail"].endswith(
        "Incorrect API key provided (no API key was given: set $OPENAI_API_KEY or --api-key)"
    )


def test_a_server_that_reports_no_usage_is_warned_of(tmp_path, capsys):
    """Its calls count no tokens, so --max-cost never stopped a run, without a word."""
    rows, sequential = sequential_rows(2)
    stats, kept, _ = curate(tmp_path, sequential, StandIn({rows[0]["prompt"]: "no_usage"}))
    assert len(kept) == 2 and stats["tokens"]["segment"]["unreported"] == 1
    assert capsys.readouterr().err.count("reports no token usage: its calls count no tokens") == 1


def test_generate_rows_end_without_their_end_of_turn_token(tmp_path):
    """A `generate` row's text ends with <|im_end|>; kept, the trainer added its own and trained two."""
    _, sequential = sequential_rows(2)
    for row in sequential:
        row["messages"][-1]["content"] += "<|im_end|>"
    _, kept, _ = curate(tmp_path, sequential, StandIn())
    assert len(kept) == 2 and not any(r["messages"][-1]["content"].endswith("<|im_end|>") for r in kept.values())


def test_a_call_cache_that_is_not_sqlite_is_one_line(tmp_path):
    _, sequential = sequential_rows(1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "calls.sqlite").write_text("garbage")
    with pytest.raises(ValueError, match=r"calls\.sqlite is not a call cache \(file is not a database\); move it"):
        curate(tmp_path, sequential, StandIn())


def test_max_cost_stops_starting_traces(tmp_path):
    _, sequential = sequential_rows(12)
    llm = replace(FAST, concurrency=1)
    stats, kept, dropped = curate(tmp_path, sequential, StandIn(), llm=llm, price_prompt=1e6, max_cost=1.0)
    assert 0 < len(kept) < 12
    assert stats["dropped"]["segment"] == {"max_cost": 12 - len(kept)}


def test_dry_run_estimates_and_calls_nothing(tmp_path, capsys):
    _, sequential = sequential_rows(5)
    write_jsonl(str(tmp_path / "t.jsonl"), sequential)
    main(["curate", str(tmp_path / "t.jsonl"), str(tmp_path / "out"), "--dry-run", "--tokenizer", "synth"])
    printed = capsys.readouterr().out
    assert "5 of 5 traces would be curated" in printed and "about 15 calls" in printed
    assert not os.path.exists(tmp_path / "out")


def test_the_command_writes_rows_sft_reads_and_says_what_it_did(tmp_path, capsys):
    _, sequential = sequential_rows(4)
    write_jsonl(str(tmp_path / "t.jsonl"), sequential)
    with stand_in_server(StandIn()) as url:
        main(["curate", str(tmp_path / "t.jsonl"), str(tmp_path / "out"), "--base-url", url, "--model", "m"])
    printed = capsys.readouterr().out
    assert "traces 4, kept 4" in printed and "LLM calls 12" in printed
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["kept"] == 4 and report["llm"]["model"] == "m"
    from threadweaver.kit.tokenizers import load_tokenizer
    from threadweaver.rows import RowReader

    reader = RowReader(load_tokenizer("qwen"))
    rows = [row for _, row in read_jsonl(str(tmp_path / "out" / "train.jsonl"))]
    for row in rows:
        assert reader.trajectory(row) and row["tokenizer"] == "qwen"
    capsys.readouterr()
    main(["stats", str(tmp_path / "out" / "train.jsonl"), "--json"])  # no --tokenizer: the rows say qwen
    counted = [r["total_tokens"] for r in json.loads(capsys.readouterr().out)["rows"]]
    from threadweaver.report import file_stats

    with_qwen = [r.stats.total_tokens for r in file_stats(str(tmp_path / "out" / "train.jsonl"), reader)]
    synth = RowReader(load_tokenizer("synth"))
    with_synth = [r.stats.total_tokens for r in file_stats(str(tmp_path / "out" / "train.jsonl"), synth)]
    assert counted == with_qwen != with_synth  # Qwen's tokens, not the synth tokenizer's characters


@pytest.mark.parametrize(
    "argv, message",
    [
        (["missing.jsonl", "out", "--model", "m"], "threadweaver curate: missing.jsonl: no such file"),
        (["t.jsonl", "out"], "--model NAME"),
        (["t.jsonl", "out", "--model", "m", "--max-threads", "1"], "--max-threads must be 2..16"),
        (["t.jsonl", "out", "--model", "m", "--max-units", "5001"], "--max-units must be 2..4096"),
        (["t.jsonl", "out", "--model", "m", "--extra-body", "[1]"], "--extra-body must be a JSON object"),
        (["t.jsonl", "out", "--model", "m", "--reasks", "-1"], "--reasks must be a whole number of at least 0, not -1"),
        (["t.jsonl", "out", "--model", "m", "--max-cost", "5"], "--max-cost needs the prices it counts"),
        (["t.jsonl", "out", "--model", "m", "--price-prompt", "-1"], "--price-prompt must be 0 or more USD, not -1"),
        (["t.jsonl", "out", "--model", "m", "--limit", "-1"], "--limit must be a whole number of at least 1"),
        (["t.jsonl", "out", "--model", "m", "--timeout-s", "0"], "--timeout-s must be a finite number of seconds"),
        (["t.jsonl", "out", "--model", "m", "--temperature", "-3"], "--temperature must be 0 to 2"),
    ],
)
def test_bad_commands_say_what_is_wrong_in_one_line(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    write_jsonl("t.jsonl", sequential_rows(1)[1])
    with pytest.raises(SystemExit) as exit_:
        main(["curate", *argv])
    assert message in str(exit_.value) and "\n" not in str(exit_.value)


def test_parquet_traces_in_flat_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, _ = sequential_rows(3)
    flat = [{"id": r["id"], "problem": r["prompt"], "response": r["sequential"], "answer": r["answer"]} for r in rows]
    pq.write_table(pa.Table.from_pylist(flat), tmp_path / "traces.parquet")
    with stand_in_server(StandIn()) as url:
        stats = run(
            CurateArgs(str(tmp_path / "traces.parquet"), str(tmp_path / "out"), tokenizer="synth"),
            replace(FAST, base_url=url),
            CurateConfig(),
        )
    kept = [row for _, row in read_jsonl(str(tmp_path / "out" / "train.jsonl"))]
    assert stats["kept"] == 3 and [k["messages"][1]["content"] for k in kept] == [r["parallel"] for r in rows]


def test_units_tile_the_reasoning():
    for text in ["\nA\nB\n\n\nC\n", "A", "  A\n\n", "\n\n", "A\r\nB\n"]:
        lead, units = split_units(text)
        assert lead + "".join(units) == text
        assert all(u.strip() for u in units)


def test_generate_rows_give_their_problem_from_the_prompt_ids():
    reader = target_reader("qwen")
    fmt = reader.fmt
    prompt = "<|im_start|>system\nx<|im_end|>\n<|im_start|>user\nA=1+2\nA=?<|im_end|>\n<|im_start|>assistant\n"
    row = {
        "id": "g",
        "prompt_ids": fmt.codec.encode(prompt),
        "text": "<think>\nA=1+2\n</think>\n\\boxed{3}",
        "answer": 3,
    }
    trace = to_trace(row, 1, reader)
    assert (trace.problem, trace.units, trace.final, trace.answer) == ("A=1+2\nA=?", ("A=1+2\n",), "\n\\boxed{3}", "3")
    # the system turn stays in the prompt; the record of the sequential trajectory does not follow
    assert trace.prompt == ({"role": "system", "content": "x"}, {"role": "user", "content": "A=1+2\nA=?"})
    record = {"sample": 0, "token_ids": [1], "tree": {}, "stats": {}, "finish_reason": "stop", "tokenizer": "qwen"}
    assert to_trace({**row, **record}, 1, reader).fields == {"sample": 0}


def test_prompt_ids_that_are_not_the_tokenizers_drop_the_row_as_unreadable_naming_the_field(tmp_path, capsys):
    rows = [
        sequential_rows(1)[1][0],
        {"id": "p", "prompt_ids": "abc", "response": "<think>a\nb</think>x", "answer": "1"},
        {"id": "q", "prompt_ids": [-5], "response": "<think>a\nb</think>x", "answer": "1"},
    ]
    write_jsonl(str(tmp_path / "t.jsonl"), rows)
    main(["curate", str(tmp_path / "t.jsonl"), str(tmp_path / "dry"), "--dry-run", "--tokenizer", "synth"])
    assert "1 of 3 traces would be curated (2 dropped at ingest)" in capsys.readouterr().out
    _, kept, dropped = curate(tmp_path, rows, StandIn())
    assert list(kept) == [rows[0]["id"]]
    assert [(d["stage"], d["reason"]) for d in dropped] == [("ingest", "unreadable")] * 2
    assert dropped[0]["detail"] == "line 2: field 'prompt_ids' must be a non-empty list of token ids"
    assert dropped[1]["detail"] == "line 3: field 'prompt_ids' holds token id -5 at position 0: ids are not negative"


def test_extract_and_edits_check_what_code_can_check():
    row = chat_row(make_rows(1, 0)[0], "sequential")
    trace = to_trace(row, 1)
    n = len(trace.units)

    def block(*spans):
        return ProposedBlock(threads=[Span(first=a, last=b) for a, b in spans])

    assert extract(trace, block((1, 1), (2, 2)), 4, 10).threads[1] == trace.units[1].rstrip()
    for spans, reason in [
        (((1, 1), (3, 3)), "thread_gap"),
        (((1, 2), (2, 3)), "thread_overlap"),
        (((1, 1), (2, n + 1)), "out_of_range"),
        (((1, 1), (2, 2), (3, 3)), "thread_count"),
    ]:
        with pytest.raises(Refused) as refused:
            extract(trace, block(*spans), 2, 10)
        assert refused.value.reason == reason
    with pytest.raises(Refused, match="characters outside the longest thread"):
        extract(trace, block((1, 1), (2, 2)), 4, 10_000)
    two = Block(((0, 1), (1, 2)), ("x=1+1 is 2", "y=4+5 is 9"))
    assert apply_edits(two, [Edit(thread=2, find="9", replace="nine")], 20, 0.5).threads[1] == "y=4+5 is nine"
    for edit, reason in [
        (Edit(thread=3, find="x", replace="y"), "edit_thread"),
        (Edit(thread=1, find="q", replace="y"), "edit_absent"),
        (Edit(thread=1, find="1", replace="one"), "edit_ambiguous"),
        (Edit(thread=1, find="x=1+1 is 2", replace="z"), "too_changed"),
        (Edit(thread=1, find="x", replace="y" * 30), "edit_too_large"),
    ]:
        with pytest.raises(Refused) as refused:
            apply_edits(two, [edit], 20, 0.5)
        assert refused.value.reason == reason
    assert assemble(trace, []) == row["messages"][1]["content"]


def test_the_schemas_are_strict_and_bounded():
    schema = json_schema(Segmentation)
    assert "$defs" not in json.dumps(schema) and schema["additionalProperties"] is False
    span = schema["properties"]["blocks"]["items"]["properties"]["threads"]["items"]
    assert span["required"] == ["first", "last"] and span["properties"]["first"]["maximum"] == 4096


# ---- issue 38 ----


def test_max_units_is_one_bound_for_the_schema_sent_and_the_reply_checked():
    assert CurateConfig(max_units=MOST_UNITS).max_units == MOST_UNITS
    with pytest.raises(ValueError, match=f"max_units must be 2..{MOST_UNITS}"):
        CurateConfig(max_units=MOST_UNITS + 1)
    schema = segmentation_schema(MOST_UNITS, 4)  # the largest trace --max-units lets in
    span = schema["properties"]["blocks"]["items"]["properties"]["threads"]["items"]["properties"]
    top = span["last"]["maximum"]
    reply = {"blocks": [{"threads": [{"first": top - 1, "last": top - 1}, {"first": top, "last": top}]}]}
    assert Segmentation.model_validate(reply)  # what the schema sent allows, validation allows


class Corrected(StandIn):
    """The stand-in, except that told why its reply was refused it answers right (as an LLM often
    does); ``told`` keeps what it was told."""

    def __init__(self, faults):
        super().__init__(faults)
        self.told: list[str] = []
        self.reasked = threading.local()  # a thread per request

    def fault_for(self, user):
        return None if self.reasked.on else super().fault_for(user)

    def reply(self, body):
        self.reasked.on = len(body["messages"]) > 2
        if self.reasked.on:
            with self.lock:
                self.told.append(body["messages"][-1]["content"])
        return super().reply(body)


@pytest.mark.parametrize("fault", ["off_by_one", "overlap"])
def test_bad_spans_are_asked_again_with_the_exact_complaint(tmp_path, fault):
    rows, sequential = sequential_rows(3)
    stand_in = Corrected({rows[1]["prompt"]: fault})
    stats, kept, dropped = curate(tmp_path, sequential, stand_in)
    assert set(kept) == {r["id"] for r in rows} and not dropped
    assert kept[rows[1]["id"]]["messages"][1]["content"] == rows[1]["parallel"]
    assert stand_in.answered["segment"] == 3 + 1 and stats["tokens"]["segment"]["failures"] == 0
    trace = to_trace(sequential[1], 2)
    first, second = [k for k, unit in enumerate(trace.units, 1) if unit[1] == "=" and unit[0] in "ABCDEFGH"][:2]
    (told,) = stand_in.told
    if fault == "off_by_one":  # thread 2 shifted down a unit
        complaint = (
            f"thread 2 starts at unit {second + 1}, but thread 1 ends at unit {first}: no thread has unit {second}"
        )
    else:  # thread 2 starts where thread 1 does
        complaint = f"thread 2 starts at unit {first}, but thread 1 ends at unit {first}: both have unit {first}"
    assert complaint in told and f"thread 2 must start at unit {first + 1}" in told


def test_bad_spans_asked_again_in_vain_drop_the_trace_at_extract(tmp_path):
    rows, sequential = sequential_rows(2)
    stand_in = StandIn({rows[0]["prompt"]: "off_by_one"})  # it repeats the fault when asked again
    _, kept, dropped = curate(tmp_path, sequential, stand_in)
    assert set(kept) == {rows[1]["id"]} and stand_in.answered["segment"] == 2 + 1
    assert [(d["stage"], d["reason"]) for d in dropped] == [("extract", "thread_gap"), ("extract", "no_block")]


def cached(path) -> int:
    """Replies in a call cache that another process may be writing (0 before it exists)."""
    if not path.exists():
        return 0
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return db.execute("SELECT COUNT(*) FROM replies").fetchone()[0]
    except sqlite3.OperationalError:  # locked, or no table yet
        return 0


def test_ctrl_c_says_in_one_line_that_a_rerun_resumes_and_the_rerun_asks_nothing_twice(tmp_path):
    rows, sequential = sequential_rows(4)
    write_jsonl(str(tmp_path / "sequential.jsonl"), sequential)  # where curate() reads it again
    out = tmp_path / "out"
    held = StandIn({rows[2]["prompt"]: "timeout"}, timeout_sleep_s=60)  # one trace waits on its segment reply
    command = [CLI, "curate", str(tmp_path / "sequential.jsonl")]
    with stand_in_server(held) as url:
        process = subprocess.Popen(
            [*command, str(out), "--base-url", url, "--model", FAST.model, "--tokenizer", "synth"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while cached(out / "calls.sqlite") < 3 * 3 and time.monotonic() < deadline:  # the other three replied
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130  # as a shell reports Ctrl-C
    assert stderr.count("\n") == 1 and re.match(r"threadweaver curate: stopped after \d of 4 traces", stderr)
    assert "rerun the same command to resume" in stderr and str(out / "calls.sqlite") in stderr
    assert cached(out / "calls.sqlite") == 9 and not (out / "train.jsonl").exists()
    again = StandIn()
    _, kept, _ = curate(tmp_path, None, again)
    assert len(kept) == 4 and again.answered == {"segment": 1, "decouple": 1, "outline": 1}


def test_chat_rows_keep_their_system_turn_and_fields(tmp_path):
    rows, sequential = sequential_rows(2)
    system = {"role": "system", "content": "Think step by step."}
    chat = {**sequential[0], "source": "synth", "difficulty": 3}
    chat["messages"] = [system, *chat["messages"]]
    flat = {"id": rows[1]["id"], "problem": rows[1]["prompt"], "response": rows[1]["sequential"]}
    flat |= {"answer": rows[1]["answer"], "source": "flat", "tags": ["a"]}
    _, kept, _ = curate(tmp_path, [chat, flat], StandIn())
    first, second = kept[rows[0]["id"]], kept[rows[1]["id"]]
    assert first["messages"][:2] == [system, {"role": "user", "content": rows[0]["prompt"]}]
    assert first["messages"][2] == {"role": "assistant", "content": rows[0]["parallel"]}
    assert (first["source"], first["difficulty"]) == ("synth", 3)
    assert second == {
        "id": rows[1]["id"],
        "source": "flat",
        "tags": ["a"],
        "messages": [
            {"role": "user", "content": rows[1]["prompt"]},
            {"role": "assistant", "content": rows[1]["parallel"]},
        ],
        "answer": rows[1]["answer"],
        "tokenizer": "synth",  # the one curate tokenised with, for the readers
    }


def test_when_no_trace_reaches_the_server_the_command_fails_naming_its_url_and_keeps_the_outputs(tmp_path):
    write_jsonl(str(tmp_path / "t.jsonl"), sequential_rows(2)[1])
    out = tmp_path / "out"
    out.mkdir()
    earlier = {"train.jsonl": '{"id": "a"}\n{"id": "b"}\n', "dropped.jsonl": '{"id": "c"}\n', "report.json": "{}"}
    for name, text in earlier.items():
        (out / name).write_text(text)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    argv = ["curate", str(tmp_path / "t.jsonl"), str(out), "--base-url", url, "--model", "m"]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--tokenizer", "synth", "--retries", "0"])
    message = str(exit_.value.code)
    assert message.startswith("threadweaver curate: nothing curated") and "\n" not in message
    assert url in message and "2 connection" in message and f"outputs in {out} are left as they were" in message
    assert {name: (out / name).read_text() for name in earlier} == earlier
    with pytest.raises(SystemExit) as exit_:  # a new folder: not made (it was, holding an empty call cache)
        main([*argv[:2], str(tmp_path / "new"), *argv[3:], "--tokenizer", "synth", "--retries", "0"])
    assert str(exit_.value.code).startswith("threadweaver curate: nothing curated")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("traces", ["replies_all_bad", "empty"])
def test_a_run_that_keeps_no_trace_fails_and_keeps_the_outputs_of_an_earlier_one(tmp_path, traces, capsys):
    rows, sequential = sequential_rows(2)
    write_jsonl(str(tmp_path / "t.jsonl"), sequential if traces == "replies_all_bad" else [])
    earlier = {"train.jsonl": '{"id": "a"}\n', "dropped.jsonl": "", "report.json": "{}"}
    first = "line 1: segment, invalid_json"
    why = "no trace to curate" if traces == "empty" else f"nothing kept (the first dropped: {first}"
    for out in (tmp_path / "earlier", tmp_path / "first"):
        out.mkdir()
        if out.name == "earlier":
            for name, text in earlier.items():
                (out / name).write_text(text)
        argv = ["curate", str(tmp_path / "t.jsonl"), str(out), "--model", "m", "--tokenizer", "synth"]
        stand_in = StandIn({r["prompt"]: "bad_json" for r in rows})
        with stand_in_server(stand_in) as url, pytest.raises(SystemExit) as exit_:
            main([*argv, "--base-url", url])
        message = str(exit_.value.code)
        assert message.startswith(f"threadweaver curate: {tmp_path / 't.jsonl'}: {why}") and "\n" not in message
        assert ("traces 2, kept 0" in capsys.readouterr().out) == (traces != "empty")
        if out.name == "earlier":  # its finished work stays
            assert message.endswith(f"; the outputs in {out} are left as they were")
            assert {name: (out / name).read_text() for name in earlier} == earlier
        elif traces == "replies_all_bad":  # a first run writes why, with rc 1
            assert message.endswith(f"; why each trace was dropped: {out / 'dropped.jsonl'}")
            assert (out / "train.jsonl").read_text() == ""
            assert len((out / "dropped.jsonl").read_text().splitlines()) == 2
            assert json.loads((out / "report.json").read_text())["kept"] == 0


def test_deepseek_r1_responses_without_an_opening_think_are_curated(tmp_path):
    rows, sequential = sequential_rows(2)
    r1 = [
        {**row, "messages": [row["messages"][0], {"role": "assistant", "content": row["messages"][1]["content"][7:]}]}
        for row in sequential
    ]
    assert not r1[0]["messages"][1]["content"].startswith("<think>")
    _, kept, dropped = curate(tmp_path, r1, StandIn())
    assert not dropped and [kept[r["id"]]["messages"][1]["content"] for r in rows] == [r["parallel"] for r in rows]


def test_traces_all_dropped_at_ingest_name_no_file_that_was_not_written(tmp_path):
    """It pointed at OUT/dropped.jsonl, which a run that called nothing does not write."""
    rows = tmp_path / "t.jsonl"
    rows.write_text(json.dumps({"problem": "1+1?", "response": "2", "answer": "2"}) + "\n")
    with pytest.raises(SystemExit) as exit_:
        main(["curate", str(rows), str(tmp_path / "out"), "--model", "m", "--base-url", "http://127.0.0.1:9/v1"])
    said = str(exit_.value)
    assert "the response has no <think>...</think> reasoning" in said and "dropped.jsonl" not in said
    assert said.endswith("; nothing was written: every trace was dropped before any call")
    assert not (tmp_path / "out").exists()


def test_an_outline_that_numbers_itself_is_not_numbered_twice():
    """The prompt asks for none; "1: add A" was kept, and the block read <Outline>1:1: add A</Outline>."""
    block = Block(((0, 1), (1, 2)), ("x", "y"))
    assert with_outlines(block, ["1: add A", "2.add B"]).outlines == ("add A", "add B")
    assert with_outlines(block, ["3 cases", "2) B"]).outlines == ("3 cases", "B")  # only its own number


def test_a_trace_that_is_parallel_already_is_dropped_at_ingest_before_any_call(tmp_path):
    """It reached the LLM, which was paid to rewrite it."""
    rows = make_rows(2, 0)
    sequential = [chat_row(rows[0], "sequential"), chat_row(rows[1], "parallel")]
    stand_in = StandIn()
    stats, kept, dropped = curate(tmp_path, sequential, stand_in)
    assert list(kept) == [rows[0]["id"]] and stand_in.answered["segment"] == 1
    (parallel,) = [d for d in dropped if d["id"] == rows[1]["id"]]
    assert (parallel["stage"], parallel["reason"]) == ("ingest", "already_parallel")


# ---- paths and inputs, refused before any call ----


def test_an_out_that_holds_the_traces_file_is_refused_before_any_call(tmp_path, monkeypatch):
    """OUT/train.jsonl was written over the traces it was read from."""
    monkeypatch.chdir(tmp_path)
    write_jsonl("data/train.jsonl", sequential_rows(2)[1])
    os.symlink("data", "link")
    os.mkdir("other")
    os.symlink("../data/train.jsonl", "other/dropped.jsonl")
    before = (tmp_path / "data" / "train.jsonl").read_text()
    stand_in = StandIn()
    for out, written in [("data", "data/train.jsonl"), ("./data/", "./data/train.jsonl"), ("link", "link/train.jsonl")]:
        with stand_in_server(stand_in) as url, pytest.raises(SystemExit) as exit_:
            main(["curate", "data/train.jsonl", out, "--model", "m", "--base-url", url, "--tokenizer", "synth"])
        assert str(exit_.value) == f"threadweaver curate: {written} is the input file data/train.jsonl; name another"
    with pytest.raises(SystemExit, match="other/dropped.jsonl is the input file data/train.jsonl; name another"):
        main(["curate", "data/train.jsonl", "other", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"])
    assert not stand_in.answered and (tmp_path / "data" / "train.jsonl").read_text() == before
    assert sorted(os.listdir("data")) == ["train.jsonl"]  # no call cache made either


def test_a_call_cache_that_cannot_be_opened_is_one_line_before_any_call(tmp_path):
    """It was sqlite3.OperationalError's traceback: "unable to open database file"."""
    write_jsonl(str(tmp_path / "t.jsonl"), sequential_rows(1)[1])
    (tmp_path / "out" / "calls.sqlite").mkdir(parents=True)
    argv = ["curate", str(tmp_path / "t.jsonl"), str(tmp_path / "out"), "--model", "m", "--tokenizer", "synth"]
    stand_in = StandIn()
    with stand_in_server(stand_in) as url, pytest.raises(SystemExit) as exit_:
        main([*argv, "--base-url", url])
    cache = tmp_path / "out" / "calls.sqlite"
    assert str(exit_.value) == f"threadweaver curate: {cache} is a directory; move it, or give another folder"
    assert not stand_in.answered and os.listdir(tmp_path / "out") == ["calls.sqlite"]
    with pytest.raises(ValueError, match=r"calls\.sqlite is a folder, not a call cache; move it away"):
        CallCache(str(cache))  # the cache itself says so too


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("rows.json", '{"id": "a"}', "rows.json: a .json input must be a JSON array of rows"),
        ("rows.parquet", "not parquet", "rows.parquet: not a readable parquet file (Parquet magic bytes not found"),
        ("rows.jsonl", None, "rows.jsonl: a folder, not a file of rows"),
        ("missing.jsonl", "", "missing.jsonl: no such file"),
    ],
)
def test_an_input_that_cannot_be_read_is_named(tmp_path, monkeypatch, name, text, message):
    monkeypatch.chdir(tmp_path)
    if text is None:
        os.mkdir(name)
    elif text:
        (tmp_path / name).write_text(text)
    for dry in ([], ["--dry-run"]):
        with pytest.raises(SystemExit) as exit_:
            main(["curate", name, "out", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--retries", "0", *dry])
        assert str(exit_.value).startswith(f"threadweaver curate: {message}") and "\n" not in str(exit_.value)
    assert not os.path.exists("out")


def test_an_out_that_is_a_file_is_refused_first(tmp_path, monkeypatch):
    """It was "[Errno 17] File exists: 'gen.jsonl'", after the traces were read."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gen.jsonl").write_text("mine\n")
    for traces in ("missing.jsonl", "gen.jsonl"):
        with pytest.raises(SystemExit) as exit_:
            main(["curate", traces, "gen.jsonl", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"])
        assert str(exit_.value) == "threadweaver curate: OUT gen.jsonl: a file, not a folder"
    with pytest.raises(SystemExit, match=r"cannot write into gen\.jsonl/out: .*gen\.jsonl is a file, not a folder"):
        main(["curate", "gen.jsonl", "gen.jsonl/out", "--dry-run"])
    assert (tmp_path / "gen.jsonl").read_text() == "mine\n"


def test_a_dry_run_names_the_first_dropped_line_and_refuses_no_trace_as_the_run_does(tmp_path, capsys):
    _, sequential = sequential_rows(2)
    path, out = tmp_path / "t.jsonl", str(tmp_path / "out")
    path.write_text("{not json\n" + "".join(json.dumps(row) + "\n" for row in sequential) + '{"id": "x"}\n')
    main(["curate", str(path), out, "--dry-run", "--tokenizer", "synth"])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "2 of 4 traces would be curated (2 dropped at ingest)"
    assert printed[1].startswith("the first dropped: line 1: ingest, unreadable: not JSON (Expecting property name")
    path.write_text("\n")
    for dry in (["--dry-run"], ["--model", "m", "--base-url", "http://127.0.0.1:9/v1"]):  # the same refusal
        with pytest.raises(SystemExit) as exit_:
            main(["curate", str(path), out, "--tokenizer", "synth", *dry])
        assert str(exit_.value) == f"threadweaver curate: {path}: no trace to curate"
    assert not os.path.exists(out)
