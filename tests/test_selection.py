"""``threadweaver filter``: which generated trajectories train the next model, each drop with its reason.

Rows are made as ``threadweaver generate`` makes them: the orchestrator decodes a script with
the embedded synth tokenizer and :func:`threadweaver.batch.trajectory_row` writes the row.
"""

import asyncio
import json
import os
import re

import pytest

from threadweaver.batch import trajectory_row
from threadweaver.cli import main as cli
from threadweaver.format import Format
from threadweaver.jsonl import RowError
from threadweaver.kit.tokenizers import load_tokenizer
from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.rows import RowReader
from threadweaver.selection import FilterConfig, judge, select
from threadweaver.testing import ScriptedEngine

PROMPT = "A+B=?"
HEAD = "<Parallel><Outlines><Outline>1:A</Outline><Outline>2:B</Outline></Outlines>"


def parallel(two: str = "3+4=7", answer: str = "10") -> dict:
    return {
        PROMPT: "\n" + HEAD,
        "<Thread>1:": "1+2=3</Thread>",
        "<Thread>2:": two + "</Thread>",
        "</Parallel>": f"\n3+7=10\\boxed{{{answer}}}<EOS>",
    }


SEQUENTIAL = {PROMPT: "\n1+2=3\n3+4=7\n3+7=10\\boxed{10}<EOS>"}
DEGRADED = {**parallel(), "<Thread>2:": "3+4=7<EOS>"}  # EOS inside a thread: closed by the orchestrator


@pytest.fixture(scope="module")
def synth():
    return Format.from_tokenizer(load_tokenizer("synth"))


def row(fmt, script, limits=Limits(), answer="10", problem="p", sample=0) -> dict:
    """The row ``generate`` writes, as a reader reads it back."""
    t = asyncio.run(Orchestrator(ScriptedEngine(fmt, script), fmt, limits).run(fmt.encode(PROMPT)))
    extra = {} if answer is None else {"answer": answer}
    return json.loads(json.dumps(trajectory_row(t, fmt, 0.0, limits, id=problem, sample=sample, **extra)))


def verdict(fmt, data, config=FilterConfig()):
    return judge(data, 1, RowReader(None, fmt), config)


def test_a_correct_well_formed_parallel_trajectory_is_kept(synth):
    v = verdict(synth, row(synth, parallel()))
    assert (v.reason, v.correct, v.well_formed, v.parallel) == (None, True, True, True)
    assert v.speedup > 1


@pytest.mark.parametrize(
    "make, config, reason",
    [
        (lambda f: row(f, parallel(), answer=None), FilterConfig(), "no_answer"),
        (lambda f: row(f, DEGRADED), FilterConfig(), "degraded"),
        (lambda f: row(f, SEQUENTIAL, Limits(max_tokens=5)), FilterConfig(), "truncated"),
        (lambda f: row(f, parallel(answer="11")), FilterConfig(), "wrong"),
        (lambda f: row(f, SEQUENTIAL), FilterConfig(), "sequential"),
        (lambda f: row(f, parallel()), FilterConfig(max_tokens=10), "too_long"),
    ],
    ids=["no answer", "degraded", "truncated", "wrong", "sequential", "too long"],
)
def test_each_drop_has_the_reason_of_the_first_check_it_fails(synth, make, config, reason):
    assert verdict(synth, make(synth), config).reason == reason


def test_a_trajectory_cut_at_its_budget_is_dropped_as_truncated_but_is_well_formed_as_every_host_says(synth):
    v = verdict(synth, row(synth, SEQUENTIAL, Limits(max_tokens=5)))  # filter once said 66.7% where stats said 100%
    assert v.reason == "truncated" and v.well_formed


@pytest.mark.parametrize("finish", ["timeout", "error"])
def test_a_correct_trajectory_the_timeout_or_an_engine_failure_cut_is_dropped_as_truncated(synth, finish):
    """Only a token limit's cut was dropped: a timeout's was kept, and trained on, without its end (a real engine
    failure is degraded too, and was dropped as that)."""
    v = verdict(synth, {**row(synth, parallel()), "finish_reason": finish})
    assert (v.reason, v.correct, v.detail) == ("truncated", True, f"it did not end by itself (finish_reason {finish})")


@pytest.mark.parametrize("finish", [None, "LENGTH", ["length"], 5, ""])
def test_a_finish_reason_generate_does_not_write_is_named(synth, finish):
    with pytest.raises(RowError, match=re.escape("line 1: field 'finish_reason' must be one of stop, length, timeout")):
        verdict(synth, {**row(synth, parallel()), "finish_reason": finish})
    without = {k: v for k, v in row(synth, parallel()).items() if k != "finish_reason"}
    assert verdict(synth, without).reason is None  # a row from elsewhere that does not say is taken as whole


def test_a_malformed_text_row_is_dropped_as_malformed_with_the_position(synth):
    v = verdict(synth, {"id": "p", "answer": "10", "text": "1+2=3</Parallel>\\boxed{10}"})
    assert v.reason == "malformed" and v.correct and not v.well_formed
    assert "</Parallel>" in v.detail and "token" in v.detail


def test_sequential_ones_are_kept_when_asked(synth):
    assert verdict(synth, row(synth, SEQUENTIAL), FilterConfig(keep_sequential=True)).reason is None


def test_per_problem_keeps_the_best_speedups_and_the_report_accounts_for_every_row(synth, tmp_path):
    rows = [
        row(synth, parallel("3+4=7\n4+3=7\n7=7"), problem="p", sample=0),  # thread 2 the longer: a worse speedup
        row(synth, parallel("3+4=7"), problem="p", sample=1),
        row(synth, parallel(answer="11"), problem="p", sample=2),
        row(synth, parallel(), problem="q", sample=0),
        row(synth, SEQUENTIAL, problem="q", sample=1),
    ]
    path = tmp_path / "gen.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept, verdicts, report = select(str(path), RowReader(None, synth), FilterConfig(per_problem=1))
    assert kept == [rows[1], rows[3]]  # unchanged, in file order
    assert [v.reason for v in verdicts] == ["per_problem", None, "wrong", None, "sequential"]
    assert report["dropped"] == {"wrong": 1, "sequential": 1, "per_problem": 1}
    assert report["kept"] + sum(report["dropped"].values()) == report["rows"] == 5
    assert report["pass_at_1"] == pytest.approx(4 / 5) and report["parallel_activation_ratio"] == pytest.approx(4 / 5)
    kept, _, _ = select(str(path), RowReader(None, synth), FilterConfig(per_problem=2))
    assert kept == [rows[0], rows[1], rows[3]]


def test_rows_without_an_id_are_one_problem_a_prompt(synth, tmp_path):
    """Rows written by another tool, without an ``id``: samples of one prompt are one problem, named by its
    first row's line, so ``per_problem`` caps them (each row was a problem of its own)."""
    rows = [row(synth, parallel(), sample=k) for k in range(3)]
    for r in rows:
        del r["id"]
    path = tmp_path / "gen.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept, verdicts, report = select(str(path), RowReader(None, synth), FilterConfig(per_problem=1))
    assert kept == [rows[0]] and [v.problem for v in verdicts] == ["line-1"] * 3
    assert report["problems"] == report["problems_kept"] == 1 and report["dropped"] == {"per_problem": 2}


def test_the_command_writes_the_kept_rows_and_the_report(synth, tmp_path, capsys):
    rows = [row(synth, parallel()), row(synth, parallel(answer="11"), sample=1)]
    generated, out = tmp_path / "gen.jsonl", tmp_path / "kept.jsonl"
    generated.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli(["filter", str(generated), str(out), "--per-problem", "2"])
    assert out.read_text().splitlines() == generated.read_text().splitlines()[:1]  # the row as it was
    report = json.loads((tmp_path / "kept.jsonl.report.json").read_text())
    assert [(d["line"], d["reason"]) for d in report["dropped_rows"]] == [(2, "wrong")]
    assert "pass@1               50.0%" in capsys.readouterr().out


def test_unreadable_lines_are_dropped_and_named_and_the_rest_judged(synth, tmp_path, capsys):
    """As ``convert`` does: a torn or foreign line costs itself, not the file's other samples."""
    good = row(synth, parallel())
    bad_id = {**good, "token_ids": [*good["token_ids"][:3], -1, *good["token_ids"][4:]]}
    generated, out = tmp_path / "gen.jsonl", tmp_path / "kept.jsonl"
    generated.write_text(json.dumps(good) + "\n{not json\n" + json.dumps(bad_id) + "\n")
    cli(["filter", str(generated), str(out)])
    assert out.read_text().splitlines() == generated.read_text().splitlines()[:1]
    report = json.loads((tmp_path / "kept.jsonl.report.json").read_text())
    assert [(d["line"], d["reason"]) for d in report["dropped_rows"]] == [(2, "unreadable"), (3, "unreadable")]
    assert report["dropped_rows"][1]["detail"].startswith("field 'token_ids' holds token id -1 at position 3")
    assert (report["rows"], report["problems"], report["kept"], report["pass_at_1"]) == (3, 1, 1, 1.0)
    printed = capsys.readouterr()
    assert f"{generated}: 2 unreadable lines dropped (the first: line 2: not JSON" in printed.err
    assert "dropped, unreadable  2" in printed.out


def test_bad_input_is_one_line_naming_the_file_and_line(synth, tmp_path):
    generated = tmp_path / "gen.jsonl"
    generated.write_text("\n{not json\n")
    with pytest.raises(SystemExit, match=r"gen\.jsonl: line 2: not JSON"):
        cli(["filter", str(generated), str(tmp_path / "kept.jsonl")])
    assert not (tmp_path / "kept.jsonl").exists()
    generated.write_text(json.dumps(row(synth, parallel())) + "\n")
    with pytest.raises(SystemExit, match=r"gen\.jsonl is the input file"):
        cli(["filter", str(generated), str(generated)])
    with pytest.raises(SystemExit, match="--per-problem must be at least 1, not 0"):
        cli(["filter", str(generated), str(tmp_path / "k.jsonl"), "--per-problem", "0"])


@pytest.mark.parametrize("token", [-1, 10**30, 2**31], ids=["negative", "huge", "past every vocabulary"])
def test_a_token_id_outside_the_vocabulary_is_one_line_naming_the_line_field_and_position(synth, tmp_path, token):
    bad = row(synth, parallel())
    bad["token_ids"][3] = token
    generated = tmp_path / "gen.jsonl"
    generated.write_text("\n" + json.dumps(bad) + "\n")  # the only row: where others can be read, it is dropped
    with pytest.raises(SystemExit) as exit_:
        cli(["filter", str(generated), str(tmp_path / "kept.jsonl")])
    message = str(exit_.value.code)
    why = ": ids are not negative" if token < 0 else ", outside the vocabulary (0..2147483647)"
    assert f"gen.jsonl: line 2: field 'token_ids' holds token id {token} at position 3{why}" in message
    assert "\n" not in message and not (tmp_path / "kept.jsonl").exists()


def test_a_generated_token_id_past_the_tokenizers_length_is_read(synth, tmp_path):
    """A model's padded vocabulary (the kit's tiny Qwen3: a multiple of 64) can sample past the tokenizer."""
    padded = row(synth, parallel())
    padded["token_ids"][3] = len(load_tokenizer("synth")) + 3
    padded["text"] = synth.decode(padded["token_ids"])  # as generate writes it
    generated = tmp_path / "gen.jsonl"
    generated.write_text(json.dumps(padded) + "\n")
    cli(["filter", str(generated), str(tmp_path / "kept.jsonl"), "--tokenizer", "synth", "--keep-sequential"])
    assert json.loads((tmp_path / "kept.jsonl.report.json").read_text())["rows"] == 1  # its tag's id replaced


def test_a_run_that_keeps_no_row_fails_naming_the_first_dropped_and_leaves_out_as_it_was(synth, tmp_path, capsys):
    """An earlier OUT is finished work, not to be emptied by a run with nothing to keep, and a new OUT is not
    made empty; the run's report (a model's pass@1, why each row was dropped) is written."""
    generated, out = tmp_path / "gen.jsonl", tmp_path / "kept.jsonl"
    generated.write_text(json.dumps(row(synth, parallel(), answer=None)) + "\n")
    earlier = "".join(json.dumps({"id": f"p{k}"}) + "\n" for k in range(5))
    out.write_text(earlier)
    (tmp_path / "kept.jsonl.report.json").write_text('{"kept": 5}')
    with pytest.raises(SystemExit) as exit_:
        cli(["filter", str(generated), str(out)])
    message = str(exit_.value.code)
    assert message == (
        f"threadweaver filter: {generated}: no row kept of 1 (the first dropped: line 1: no_answer: the row has no "
        f"'answer' to grade against); {out} is left as it was; why each row was dropped: {out}.report.json"
    )
    assert out.read_text() == earlier
    assert json.loads((tmp_path / "kept.jsonl.report.json").read_text())["dropped"] == {"no_answer": 1}
    assert "dropped, no_answer   1" in capsys.readouterr().out  # the counts
    with pytest.raises(SystemExit, match=r"no row kept of 1 \(the first dropped: line 1: no_answer: "):
        cli(["filter", str(generated), str(tmp_path / "new.jsonl")])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gen.jsonl",
        "kept.jsonl",
        "kept.jsonl.report.json",
        "new.jsonl.report.json",
    ]


@pytest.mark.parametrize(
    "answer, why",
    [(["x", 1], "is a list, not a string or a number"), (True, "is a boolean, not a string or a number")],
    ids=["a list", "a boolean"],
)
def test_an_answer_that_is_no_string_or_number_is_unreadable_naming_the_field(synth, tmp_path, answer, why):
    """Graded as text it was ``wrong`` ("math-verify"), hiding a broken problems file."""
    good = row(synth, parallel())
    generated, out = tmp_path / "gen.jsonl", tmp_path / "kept.jsonl"
    generated.write_text(json.dumps(good) + "\n" + json.dumps({**good, "sample": 1, "answer": answer}) + "\n")
    cli(["filter", str(generated), str(out)])
    report = json.loads((tmp_path / "kept.jsonl.report.json").read_text())
    assert report["dropped_rows"] == [
        {"line": 2, "id": "line-2", "reason": "unreadable", "detail": f"field 'answer' {why}"}
    ]
    numeric = {**good, "answer": 10}  # a number is an answer, as its text
    generated.write_text(json.dumps(numeric) + "\n")
    cli(["filter", str(generated), str(out)])
    assert json.loads(out.read_text()) == numeric


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no file can be made")
@pytest.mark.parametrize("name", ["kept.jsonl", "nope/kept.jsonl"], ids=["in the folder", "in a folder to make"])
def test_an_out_where_no_file_can_be_made_is_refused_before_any_row_is_read(synth, tmp_path, name):
    """It was a traceback (the .tmp file, or the folder) after all the work; root may write anywhere but /proc."""
    generated = tmp_path / "gen.jsonl"
    generated.write_text("{not json\n")  # read first, this line would be the error
    out = f"/proc/{name}"
    with pytest.raises(SystemExit) as exit_:
        cli(["filter", str(generated), out])
    message = str(exit_.value.code)
    assert message.startswith(f"threadweaver filter: {out}: cannot write a file in /proc (") and "\n" not in message
    assert os.listdir(tmp_path) == ["gen.jsonl"]
