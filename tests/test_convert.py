"""``threadweaver convert``: peers' parallel datasets in our format, each refusal with its reason.

Every input row is written here in the shape its format publishes (see the module doc of
:mod:`threadweaver.convert` for the sources), with content of our own.
"""

import json
import os

import pytest

from threadweaver.cli import main as cli
from threadweaver.convert import (
    ConvertConfig,
    NothingConverted,
    Refused,
    convert_file,
    convert_multiverse,
    convert_npr,
    convert_reference,
    convert_row,
    convert_text,
    format_report,
)
from threadweaver.format import Format
from threadweaver.rows import RowReader
from threadweaver.tree import parse_text


@pytest.fixture(scope="module")
def fmt(qwen) -> Format:
    return Format.from_tokenizer(qwen)


# ---- Multiverse-1K: <Think>, <Parallel> of <Goal>/<Outline>s, <Path>s, one <Conclusion>; a tag a line ----


def goal(*outlines: str) -> str:
    return "<Goal>\n" + "".join(f"<Outline>\n{o}\n</Outline>\n" for o in outlines) + "</Goal>\n"


def path(body: str) -> str:
    return f"<Path>\n{body}\n</Path>\n"


def mv_block(outlines, paths, conclusion) -> str:
    return (
        "<Parallel>\n"
        + goal(*outlines)
        + "".join(map(path, paths))
        + f"<Conclusion>\n{conclusion}\n</Conclusion>\n</Parallel>\n"
    )


NESTED_MV = mv_block(["1.1: Halve 12", "1.2: Double 12"], ["1.1: 12 / 2 = 6", "1.2: 12 * 2 = 24"], "6 and 24.")
MULTIVERSE_TRAJECTORY = (
    "<Think>\nTwo parts.\n"
    + mv_block(
        ["1: Work on 12", "2: Work on 5"],
        ["1: Start from 12.\n" + NESTED_MV.rstrip(), "2: 5 + 5 = 10"],
        "Got 6, 24 and 10.",
    )
    + "So the total is 40.\n**Final Answer**\n\\boxed{40}\n</Think>"
)


def mv_row(trajectory=MULTIVERSE_TRAJECTORY, **extra) -> dict:
    return {
        "question": "Add half of 12, double 12 and 5 + 5.",
        "solution": "40",
        "cot_type": "math",
        "deepseek_thinking_trajectory": "sequential text",
        "deepseek_thinking_trajectory_parallel": trajectory,
        "deepseek_attempt": "The total is \\boxed{40}.",
        **extra,
    }


MULTIVERSE_EXPECTED = (
    "<think>\nTwo parts.\n"
    "<Parallel><Outlines><Outline>1:Work on 12</Outline><Outline>2:Work on 5</Outline></Outlines>"
    "<Thread>1:Start from 12.\n"
    "<Parallel><Outlines><Outline>1:Halve 12</Outline><Outline>2:Double 12</Outline></Outlines>"
    "<Thread>1:12 / 2 = 6</Thread><Thread>2:12 * 2 = 24</Thread></Parallel>\n6 and 24.</Thread>"
    "<Thread>2:5 + 5 = 10</Thread></Parallel>\nGot 6, 24 and 10.\n"
    "So the total is 40.\n**Final Answer**\n\\boxed{40}\n</think>\nThe total is \\boxed{40}."
)


def test_multiverse_nested_numbering_and_conclusions_convert_exactly(fmt):
    row = convert_multiverse(mv_row())
    assert row == {
        "messages": [
            {"role": "user", "content": "Add half of 12, double 12 and 5 + 5."},
            {"role": "assistant", "content": MULTIVERSE_EXPECTED},
        ]
    }
    parsed = parse_text(MULTIVERSE_EXPECTED, fmt, strict=True)
    assert [type(n).__name__ for n in parsed.nodes] == ["Text", "Block", "Text"]


def test_multiverse_accepts_a_bare_local_number_in_a_nested_block():
    bare = MULTIVERSE_TRAJECTORY.replace("1.1: ", "1: ").replace("1.2: ", "2: ")
    assert bare != MULTIVERSE_TRAJECTORY
    assert convert_multiverse(mv_row(bare))["messages"][1]["content"] == MULTIVERSE_EXPECTED


# ---- the reference's SFT parquet: a Qwen3 chat rendered in qwen_text ----

REFERENCE_THINK = (
    "Two products first.\n<Parallel>\n<Outlines>\n<Outline>1: Compute 2*3</Outline>\n"
    "<Outline>2: Compute 4*5</Outline>\n</Outlines>\n"
    "<Thread>\n1: 2*3 = 6.\n</Thread><Thread>\n2: 4*5 = 20.\n</Thread>\n</Parallel>\nSo 6 + 20 = 26."
)


def qwen_text(think: str = REFERENCE_THINK, answer: str = "It is \\boxed{26}.") -> str:
    return (
        "<|im_start|>user\nWhat is 2*3 + 4*5? Box the result.<|im_end|>\n"
        f"<|im_start|>assistant\n<think>\n{think}\n</think>\n\n{answer}<|im_end|>\n"
    )


def ref_row(text=None, **extra) -> dict:
    return {
        "uuid": "polaris-7",
        "question": "What is 2*3 + 4*5?",
        "response_reasoning": "...",
        "response_content": "It is \\boxed{26}.",
        "correctness": True,
        "qwen_text": qwen_text() if text is None else text,
        "num_qwen_tokens": 120,
        **extra,
    }


REFERENCE_EXPECTED = (
    "<think>\nTwo products first.\n<Parallel><Outlines><Outline>1:Compute 2*3</Outline><Outline>2:Compute 4*5</Outline>"
    "</Outlines><Thread>1:2*3 = 6.</Thread><Thread>2:4*5 = 20.</Thread></Parallel>\nSo 6 + 20 = 26.\n</think>\n\n"
    "It is \\boxed{26}."
)


def test_reference_chat_becomes_messages_and_its_thread_newlines_go():
    assert convert_reference(ref_row()) == {
        "id": "polaris-7",
        "messages": [
            {"role": "user", "content": "What is 2*3 + 4*5? Box the result."},
            {"role": "assistant", "content": REFERENCE_EXPECTED},
        ],
    }


def test_a_reference_conclusion_follows_the_join():
    think = REFERENCE_THINK.replace(
        "</Thread>\n</Parallel>", "</Thread>\n<Conclusion>\n6 and 20.\n</Conclusion>\n</Parallel>"
    )
    content = convert_reference(ref_row(qwen_text(think)))["messages"][-1]["content"]
    assert content == REFERENCE_EXPECTED.replace("</Parallel>\nSo", "</Parallel>\n6 and 20.\nSo")


# ---- NPR: <guideline> of <plan>s, <step>s after it, a <takeaway> closing the block ----


def guideline(*plans: str) -> str:
    return "<guideline>\n" + "".join(f"<plan>{p}</plan>\n" for p in plans) + "</guideline>\n"


def steps(*bodies: str) -> str:
    return "".join(f"<step>\n{b}\n</step>\n" for b in bodies)


NESTED_NPR = guideline("1: Square 3.", "2: Square 4.") + steps("1: 9", "2: 16") + "<takeaway>\n9 and 16.\n</takeaway>"
NPR_TRAJECTORY = (
    guideline("1: Sum the squares of 3 and 4.", "2: Check with a known triple.")
    + steps("1: Square each.\n" + NESTED_NPR, "2: 3-4-5 is a triple, so 25.")
    + "<takeaway>\nBoth give 25.\n</takeaway>\nThe answer is \\boxed{25}."
)
NPR_EXPECTED = (
    "<think>\n<Parallel><Outlines><Outline>1:Sum the squares of 3 and 4.</Outline>"
    "<Outline>2:Check with a known triple.</Outline></Outlines>"
    "<Thread>1:Square each.\n"
    "<Parallel><Outlines><Outline>1:Square 3.</Outline><Outline>2:Square 4.</Outline></Outlines>"
    "<Thread>1:9</Thread><Thread>2:16</Thread></Parallel>\n9 and 16.</Thread>"
    "<Thread>2:3-4-5 is a triple, so 25.</Thread></Parallel>\nBoth give 25.\n</think>\nThe answer is \\boxed{25}."
)


def npr_row(*trajectories: str, **extra) -> dict:
    return {
        "id": "b6f1",
        "time": "2025-12-01T00:00:00",
        "problem": "What is 3^2 + 4^2?",
        "prompt": "<|im_start|>user\nWhat is 3^2 + 4^2?\n\nInstructions.<|im_end|>\n<|im_start|>assistant\n",
        "reference": "25",
        "trajectory": list(trajectories or [NPR_TRAJECTORY]),
        "boxed_answer": ["\\boxed{25}"] * max(1, len(trajectories)),
        "sample_trial": 1,
        **extra,
    }


def test_npr_nested_guideline_converts_exactly_and_the_answer_leaves_think():
    row = convert_npr({**npr_row(), "trajectory": NPR_TRAJECTORY})
    assert row == {
        "id": "b6f1",
        "messages": [{"role": "user", "content": "What is 3^2 + 4^2?"}, {"role": "assistant", "content": NPR_EXPECTED}],
        "answer": "25",
    }


def test_npr_rendered_chat_text_loses_its_format_instruction():
    chat = (
        "<|im_start|>user\nWhat is 3^2 + 4^2?\n\nYou must write your answer strictly in the format.<|im_end|>\n"
        f"<|im_start|>assistant\n{NPR_TRAJECTORY}<|im_end|>\n"
    )
    row = convert_npr({"text": chat})
    assert row["messages"] == [
        {"role": "user", "content": "What is 3^2 + 4^2?"},
        {"role": "assistant", "content": NPR_EXPECTED},
    ]


def test_npr_text_field_named_is_read_and_no_other():
    """``--text-field`` names the field: a rendered chat in ``text`` is not read in its place."""
    chat = f"<|im_start|>user\nWhat is 3^2 + 4^2?<|im_end|>\n<|im_start|>assistant\n{NPR_TRAJECTORY}<|im_end|>\n"
    failure = convert_npr({"text": chat}, ConvertConfig(text_field="bogus"))
    assert failure.reason == "no_text" and "field 'bogus' is missing" in failure.detail


@pytest.mark.parametrize("final", [None, 7, "  "], ids=["missing", "a number", "blank"])
def test_a_multiverse_row_without_its_final_answer_is_no_final(final):
    """The answer after ``</think>`` is Multiverse's ``deepseek_attempt``: without it the row would teach
    the model to end on an empty answer."""
    row = mv_row() if final is None else mv_row(deepseek_attempt=final)
    if final is None:
        del row["deepseek_attempt"]
    failure = convert_multiverse(row)
    assert failure.reason == "no_final" and "field 'deepseek_attempt'" in failure.detail


def test_each_npr_trajectory_is_a_row_with_its_sample(fmt):
    second = guideline("1: Guess.") + steps("1: 25") + "<takeaway>\nOne guess.\n</takeaway>\n\\boxed{25}"
    out = convert_row(npr_row(NPR_TRAJECTORY, second), 3, "npr", fmt)
    assert [(o.reason, o.row["sample"], o.row["id"]) for o in out] == [(None, 0, "b6f1"), (None, 1, "b6f1")]
    assert out[1].row["messages"][-1]["content"] == (
        "<think>\n<Parallel><Outlines><Outline>1:Guess.</Outline></Outlines><Thread>1:25</Thread></Parallel>\n"
        "One guess.\n</think>\n\\boxed{25}"
    )
    assert (out[0].blocks, out[0].threads, out[0].depth) == (2, 4, 2)


def test_the_report_counts_npr_rows_and_their_trajectories_apart(tmp_path, fmt):
    second = guideline("1: Guess.") + steps("1: 25") + "<takeaway>\nOne guess.\n</takeaway>\n\\boxed{25}"
    rows = tmp_path / "npr.jsonl"
    rows.write_text(json.dumps(npr_row(NPR_TRAJECTORY, second)) + "\n" + json.dumps(npr_row()) + "\n")
    report = convert_file(str(rows), str(tmp_path / "out.jsonl"), "npr", fmt)
    assert (report["rows"], report["trajectories"], report["converted"]) == (2, 3, 3)
    assert format_report(report).splitlines()[0] == "rows                 2 (npr, 3 trajectories)"


def test_converted_rows_are_what_sft_reads(qwen, fmt):
    reader = RowReader(qwen, fmt)
    for source, row in [("multiverse", mv_row()), ("reference", ref_row()), ("npr", npr_row())]:
        (outcome,) = convert_row(row, 1, source, fmt)
        assert outcome.reason is None, outcome.detail
        assert reader.prompt(outcome.row) and reader.trajectory(outcome.row)


# ---- refusals: each with its reason, none crashing ----

MV_BAD = {
    "numbering": MULTIVERSE_TRAJECTORY.replace("2: Work on 5", "3: Work on 5"),
    "unbalanced": MULTIVERSE_TRAJECTORY.replace("</Path>\n<Path>\n2: 5", "<Path>\n2: 5", 1),
    "unknown_tag": MULTIVERSE_TRAJECTORY.replace("Two parts.", "Two <Thread> parts."),
    "missing_outline": MULTIVERSE_TRAJECTORY.replace("<Outline>\n2: Work on 5\n</Outline>\n", ""),
    "missing_conclusion": MULTIVERSE_TRAJECTORY.replace("<Conclusion>\nGot 6, 24 and 10.\n</Conclusion>\n", ""),
    "misplaced": MULTIVERSE_TRAJECTORY.replace("</Path>\n<Path>\n2: 5", "</Path>\nstray words\n<Path>\n2: 5"),
}


@pytest.mark.parametrize("reason", sorted(MV_BAD))
def test_a_bad_multiverse_row_has_its_reason(reason):
    assert MV_BAD[reason] != MULTIVERSE_TRAJECTORY
    failure = convert_multiverse(mv_row(MV_BAD[reason]))
    assert failure.reason == reason, failure


def test_nested_numbers_must_carry_their_parent():
    failure = convert_multiverse(mv_row(MULTIVERSE_TRAJECTORY.replace("1.2: 12 * 2", "2.2: 12 * 2")))
    assert failure.reason == "numbering"
    assert "thread 2" in failure.detail and "'2.2'" in failure.detail and "'1.2'" in failure.detail


def test_nesting_beyond_max_depth_is_too_deep():
    assert isinstance(convert_multiverse(mv_row(), ConvertConfig(max_depth=2)), dict)
    failure = convert_multiverse(mv_row(), ConvertConfig(max_depth=1))
    assert (failure.reason, "nested 2 deep; max_depth is 1" in failure.detail) == ("too_deep", True)
    assert convert_npr({**npr_row(), "trajectory": NPR_TRAJECTORY}, ConvertConfig(max_depth=1)).reason == "too_deep"


DEEP = 5000
"""Blocks nested past Python's recursion limit: a hostile row, read with a --max-depth as high."""


@pytest.mark.parametrize("source", ["multiverse", "reference", "npr"])
def test_a_row_nested_past_the_recursion_limit_is_too_deep_not_a_crash(tmp_path, source, capsys):
    """With --max-depth 500 such a row was a RecursionError traceback, the file's other rows lost."""
    if source == "multiverse":
        opened = "<Parallel>\n<Goal>\n<Outline>\n1: a\n</Outline>\n</Goal>\n<Path>\n1: x\n"
        deep = mv_row(opened * DEEP + "y\n" + "</Path>\n<Conclusion>\nc\n</Conclusion>\n</Parallel>\n" * DEEP)
        good = mv_row()
    elif source == "reference":
        opened = "<Parallel>\n<Outlines>\n<Outline>1: a</Outline>\n</Outlines>\n<Thread>\n1: x\n"
        deep, good = ref_row(qwen_text(opened * DEEP + "y" + "\n</Thread>\n</Parallel>" * DEEP)), ref_row()
    else:
        opened = guideline("1: a") + "<step>\n1: x\n"
        deep, good = npr_row(opened * DEEP + "y" + "\n</step>\n<takeaway>\nt\n</takeaway>" * DEEP), npr_row()
    out = tmp_path / "out.jsonl"
    cli(["convert", jsonl(tmp_path / "in.jsonl", [deep, good]), str(out), "--from", source, "--max-depth", "500"])
    assert len(out.read_text().splitlines()) == 1
    (dropped,) = json.loads((tmp_path / "out.jsonl.report.json").read_text())["dropped_rows"]
    assert (dropped["line"], dropped["reason"]) == (1, "too_deep") and "too deep to read" in dropped["detail"]
    assert "dropped, too_deep           1" in capsys.readouterr().out


def test_text_conversion_refusals_name_the_place():
    with pytest.raises(Refused) as err:
        convert_text("<step>\n1: x\n</step>", "npr")
    assert err.value.failure.reason == "misplaced" and "character 0" in str(err.value)
    missing = guideline("1: a", "2: b") + steps("1: x") + "<takeaway>\nt\n</takeaway>"
    assert convert_npr({"problem": "p", "trajectory": missing}).reason == "missing_thread"
    no_takeaway = guideline("1: a") + steps("1: x") + "done"
    assert convert_npr({"problem": "p", "trajectory": no_takeaway}).reason == "missing_conclusion"
    assert convert_npr({"problem": "p", "trajectory": NPR_TRAJECTORY + "</step>"}).reason == "unbalanced"
    truncated = convert_npr({"problem": "p", "trajectory": NPR_TRAJECTORY.rsplit("</takeaway>", 1)[0]})
    assert (truncated.reason, "is never closed" in truncated.detail) == ("unbalanced", True)
    stray_thread = REFERENCE_THINK.replace("<Thread>\n2:", "<Thread>\n2: <Thread>x</Thread>")
    assert convert_reference(ref_row(qwen_text(stray_thread))).reason == "misplaced"
    assert convert_reference(ref_row(qwen_text(REFERENCE_THINK.replace("Two", "<Goal>Two")))).reason == "unknown_tag"


def test_rows_without_text_problem_or_assistant():
    assert convert_multiverse({"question": "q"}).reason == "no_text"
    assert convert_multiverse(mv_row(question=None)).reason == "no_problem"
    assert convert_npr({"problem": "p", "trajectory": 7}).reason == "no_text"
    failure = convert_reference(ref_row("<|im_start|>user\nq<|im_end|>\n"))
    assert failure.reason == "no_assistant"


def test_a_null_text_field_is_said_to_be_null_not_missing():
    failure = convert_reference({**ref_row(), "qwen_text": None})
    assert (failure.reason, failure.detail) == ("no_text", "field 'qwen_text' is null, not text")
    assert convert_reference({"id": "r"}).detail == "field 'qwen_text' is missing, not text (the row has 'id')"


def test_what_our_strict_parser_refuses_is_malformed_with_its_token_position(fmt):
    empty_thread = MULTIVERSE_TRAJECTORY.replace("2: 5 + 5 = 10", "2:")
    assert isinstance(convert_multiverse(mv_row(empty_thread)), dict)  # the converter alone passes it
    (outcome,) = convert_row(mv_row(empty_thread), 4, "multiverse", fmt)
    assert (outcome.reason, outcome.row) == ("malformed", None)
    assert "token" in outcome.detail and "thread 2 is empty" in outcome.detail


def jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_a_file_goes_on_past_bad_rows_and_lists_each_with_its_line(tmp_path, fmt):
    rows = [
        mv_row(),  # 1
        mv_row(MV_BAD["numbering"], id="n"),  # 2
        "{not json",  # 3
        "",  # 4 (blank: skipped)
        mv_row(MV_BAD["missing_outline"]),  # 5
        {"question": "q"},  # 6
        mv_row(MULTIVERSE_TRAJECTORY.replace("2: 5 + 5 = 10", "2:")),  # 7
        mv_row("<Think>\nJust think.\n</Think>"),  # 8: sequential, dropped with keep_sequential off
        mv_row(),  # 9
    ]
    out = tmp_path / "out.jsonl"
    report = convert_file(
        jsonl(tmp_path / "mv.jsonl", rows), str(out), "multiverse", fmt, ConvertConfig(keep_sequential=False)
    )
    assert [(r["line"], r["id"], r["reason"]) for r in report["dropped_rows"]] == [
        (2, "n", "numbering"),
        (3, None, "unreadable"),
        (5, None, "missing_outline"),
        (6, None, "no_text"),
        (7, None, "malformed"),
        (8, None, "sequential"),
    ]
    assert report["dropped"] == {
        "unreadable": 1,
        "no_text": 1,
        "numbering": 1,
        "missing_outline": 1,
        "malformed": 1,
        "sequential": 1,
    }
    assert (report["rows"], report["converted"], report["blocks"], report["threads"], report["max_depth"]) == (
        8,
        2,
        4,
        8,
        2,
    )
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in written] == ["multiverse-1", "multiverse-9"]
    assert written[0]["messages"][1]["content"] == MULTIVERSE_EXPECTED
    assert json.loads((tmp_path / "out.jsonl.report.json").read_text()) == report
    assert "dropped, numbering" in format_report(report)
    assert not (tmp_path / "out.jsonl.tmp").exists()


def test_the_command_line_names_the_lines_it_could_not_read(tmp_path, capsys):
    """As ``filter`` and ``curate`` do: a torn line costs itself, and stderr says which it was."""
    source = jsonl(tmp_path / "mv.jsonl", [mv_row(), "{not json", mv_row(), "[1]"])
    cli(["convert", source, str(tmp_path / "out.jsonl"), "--from", "multiverse"])
    said = capsys.readouterr().err
    assert f"threadweaver convert: {source}: 2 unreadable lines dropped (the first: line 2: not JSON (" in said


def test_reference_parquet_round_trip(tmp_path, fmt):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [ref_row(uuid=f"u{k}") for k in range(300)] + [ref_row("<|im_start|>user\nq<|im_end|>\n", uuid="bad")]
    rows[1]["raw_messages"] = None
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet", row_group_size=128)
    out = tmp_path / "ref.jsonl"
    report = convert_file(str(tmp_path / "train.parquet"), str(out), "reference", fmt)
    assert (report["rows"], report["converted"]) == (301, 300)
    assert report["dropped_rows"] == [
        {"line": 301, "id": "bad", "reason": "no_assistant", "detail": report["dropped_rows"][0]["detail"]}
    ]
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in written[:2]] == ["u0", "u1"] and len(written) == 300
    assert written[299]["messages"][-1]["content"] == REFERENCE_EXPECTED


def test_the_command_line_writes_out_and_the_report(tmp_path, capsys):
    source = tmp_path / "npr.json"  # the rejection sampler's own file: a JSON array
    source.write_text(json.dumps([npr_row(), npr_row(guideline("1: a", "2: b") + steps("1: x"))], indent=4))
    out = tmp_path / "converted" / "npr.jsonl"
    cli(["convert", str(source), str(out), "--from", "npr", "--max-depth", "3"])
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["sample"], r["answer"]) for r in written] == [("b6f1", 0, "25")]
    report = json.loads((tmp_path / "converted" / "npr.jsonl.report.json").read_text())
    assert report["dropped_rows"][0] | {"detail": ""} == {
        "line": 2,
        "id": "b6f1",
        "sample": 0,
        "reason": "missing_conclusion",
        "detail": "",
    }
    assert report["config"] == {"max_depth": 3, "keep_sequential": True, "text_field": None}
    assert f"wrote {out}" in capsys.readouterr().out
    assert written[0]["tokenizer"] == "qwen"
    cli(["view", str(out), "--out", str(tmp_path / "page.html")])  # no --tokenizer: the rows say qwen
    assert "b6f1" in (tmp_path / "page.html").read_text()


@pytest.mark.parametrize("problem", ["missing", "corrupt_parquet", "same_file", "not_json_array"])
def test_a_bad_input_file_is_a_one_line_error_naming_it(tmp_path, problem):
    path = tmp_path / {"corrupt_parquet": "x.parquet", "not_json_array": "x.json"}.get(problem, "x.jsonl")
    if problem == "corrupt_parquet":
        path.write_bytes(b"not a parquet file at all")
    elif problem == "not_json_array":
        path.write_text('{"problem": "p"}')
    elif problem == "same_file":
        path.write_text("{}\n")
    out = path if problem == "same_file" else tmp_path / "out.jsonl"
    with pytest.raises(SystemExit) as exit_:
        cli(["convert", str(path), str(out), "--from", "reference"])
    message = str(exit_.value.code)
    assert message.startswith("threadweaver convert: ") and str(path) in message and "\n" not in message
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "out.jsonl.tmp").exists()


def test_rows_without_the_published_field_say_that_text_field_reads_another(tmp_path, fmt, capsys):
    rows = [{"id": f"r{k}", "text": qwen_text()} for k in range(2)]  # the chat under another name
    source = jsonl(tmp_path / "ref.jsonl", rows)
    with pytest.raises(NothingConverted) as nothing:
        convert_file(source, str(tmp_path / "out.jsonl"), "reference", fmt)
    report = nothing.value.report
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "out.jsonl.report.json").exists()
    assert report["dropped"] == {"no_text": 2}
    assert report["dropped_rows"][0]["detail"] == "field 'qwen_text' is missing, not text (the row has 'id', 'text')"
    assert (
        "dropped, no_text            2 (no text in field 'qwen_text'; --text-field NAME reads another field)"
        in format_report(report)
    )
    cli(["convert", source, str(tmp_path / "again.jsonl"), "--from", "reference", "--text-field", "text"])
    assert "converted            2" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="^threadweaver convert: --text-field is empty: name the rows' field"):
        cli(["convert", source, str(tmp_path / "empty.jsonl"), "--from", "reference", "--text-field", ""])
    assert not (tmp_path / "empty.jsonl").exists()


@pytest.mark.parametrize("rows", ["", '{"text": 5}\n[1, 2]\n'], ids=["empty", "nothing converts"])
def test_an_input_of_which_no_row_converts_leaves_the_outputs_as_they_were(tmp_path, rows, capsys):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(rows)
    out.write_text("finished work\n")
    (tmp_path / "out.jsonl.report.json").write_text("{}")  # an earlier run's output, with its report
    with pytest.raises(SystemExit) as exit_:
        cli(["convert", str(source), str(out), "--from", "reference", "--text-field", "text"])
    message = str(exit_.value.code)
    why = (
        "no row to convert"
        if not rows
        else "no row converted (the first dropped: line 1: no_text: field 'text' is a number"
    )
    assert f"{source}: {why}" in message and f"{out} is left as it was" in message and "\n" not in message
    assert out.read_text() == "finished work\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "in.jsonl",
        "out.jsonl",
        "out.jsonl.report.json",
    ]
    assert (tmp_path / "out.jsonl.report.json").read_text() == "{}"
    assert ("dropped, unreadable" in capsys.readouterr().out) == bool(rows)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no file can be made")
@pytest.mark.parametrize("name", ["out.jsonl", "nope/out.jsonl"], ids=["in the folder", "in a folder to make"])
def test_an_out_where_no_file_can_be_made_is_named_before_any_row_is_read(tmp_path, name):
    """It blamed the input and named OUT's .tmp file, after all the work; root may write anywhere but /proc."""
    source = jsonl(tmp_path / "in.jsonl", ["{not json"])  # read first, this line would be the error
    out = f"/proc/{name}"
    with pytest.raises(SystemExit) as exit_:
        cli(["convert", source, out, "--from", "reference"])
    message = str(exit_.value.code)
    assert message.startswith(f"threadweaver convert: {out}: cannot write a file in /proc (") and "\n" not in message
    assert ".tmp" not in message and os.listdir(tmp_path) == ["in.jsonl"]
