"""``python -m threadweaver.verl_rollout.data``: verl's parquet layout, and one line on stderr for every bad input.

The module needs no verl (pandas only), so it is tested here; the layout is read by verl's own
``RLHFDataset`` in ``integration_tests/verl_venv``.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from threadweaver.verl_rollout import data

PROG = "python -m threadweaver.verl_rollout.data: "


def problems(tmp_path, *rows, raw: bytes | None = None) -> str:
    path = tmp_path / "problems.jsonl"
    path.write_bytes(raw if raw is not None else b"".join(json.dumps(row).encode() + b"\n" for row in rows))
    return str(path)


def refused(capsys, *argv: str, status: int = 1) -> str:
    """The one line ``main`` stops with (no traceback), after the module's name as a user typed it."""
    with pytest.raises(SystemExit) as stopped:
        data.main(list(argv))
    assert stopped.value.code == status
    err = capsys.readouterr().err
    assert err.startswith(PROG) and err.endswith("\n") and err.count("\n") == 1, err
    return err[len(PROG) : -1]


@pytest.mark.parametrize("flag", ["--test", "--train"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_counts_must_be_positive(tmp_path, capsys, flag, value):
    message = refused(capsys, str(tmp_path / "out"), flag, value, status=2)
    assert message == f"argument {flag}: must be a whole number above 0, not '{value}'"
    assert not (tmp_path / "out").exists()


def test_an_unknown_agent_is_refused_naming_ours(tmp_path, capsys):
    message = refused(capsys, str(tmp_path / "out"), "--agent", "threadweaver_seq", status=2)
    assert "invalid choice: 'threadweaver_seq'" in message
    assert "'threadweaver'" in message and "'threadweaver_sequential'" in message


def test_existing_files_are_never_overwritten(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "test.parquet").write_bytes(b"the user's own")
    source = problems(tmp_path, *({"prompt": f"{i}+1?", "answer": str(i + 1)} for i in range(3)))
    assert refused(capsys, str(out), "--problems", source, "--test", "1") == (
        f"{out}/test.parquet exists; move it, or give another folder"
    )
    assert (out / "test.parquet").read_bytes() == b"the user's own" and not (out / "train.parquet").exists()
    assert refused(capsys, str(source), "--problems", source, "--test", "1") == (
        f"cannot write into {source}: {source} is a file, not a folder"
    )


def test_numeric_answers_are_read_as_their_text(tmp_path, capsys):
    rows = [{"prompt": "1+1?", "answer": 2}, {"prompt": "half?", "answer": 0.5}, {"prompt": "x", "answer": 10**400}]
    source = problems(tmp_path, *rows)
    data.main([str(tmp_path / "out"), "--problems", source, "--test", "1", "--agent", "threadweaver_sequential"])
    train = pd.read_parquet(tmp_path / "out" / "train.parquet")
    assert [r["ground_truth"] for r in train["reward_model"]] == ["0.5", str(10**400)]  # past a float's range
    assert set(train["agent_name"]) == {"threadweaver_sequential"} and set(train["data_source"]) == {"problems"}
    test = pd.read_parquet(tmp_path / "out" / "test.parquet")
    assert test["reward_model"][0]["ground_truth"] == "2" and list(test["prompt"][0]) == [
        {"role": "user", "content": "1+1?"}
    ]


def test_messages_rows_give_their_turns_before_the_assistants_as_the_prompt(tmp_path):
    """synth's and sft's rows (``messages``), and prompts of chat messages, were refused for want of a 'prompt'
    string; pgrpo and self-train read them."""
    system = {"role": "system", "content": "Add."}
    rows = [
        {"messages": [system, {"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}], "answer": 2},
        {"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"},
        {"prompt": [{"role": "user", "content": "3+3?"}], "answer": "6"},
    ]
    data.main([str(tmp_path / "out"), "--problems", problems(tmp_path, *rows), "--test", "1"])
    test, train = (pd.read_parquet(tmp_path / "out" / f"{split}.parquet") for split in ("test", "train"))
    assert list(test["prompt"][0]) == [system, {"role": "user", "content": "1+1?"}]
    assert list(train["prompt"][0]) == [{"role": "user", "content": "2+2?"}]
    assert list(train["prompt"][1]) == [{"role": "user", "content": "3+3?"}]
    assert [reward["ground_truth"] for reward in train["reward_model"]] == ["4", "6"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"prompt": "2+2?", "answer": ["4"]}, "line 2: field 'answer' is a list, not a string or a number"),
        ({"prompt": "2+2?", "answer": None}, "line 2: field 'answer' is null, not a string or a number"),
        ({"prompt": "2+2?", "answer": True}, "line 2: field 'answer' is a boolean, not a string or a number"),
        ({"prompt": 4, "answer": "4"}, "line 2: field 'prompt' is a number, not a string or chat messages"),
        ({"prompt": "2+2?", "answer": " "}, "line 2: field 'answer' is empty"),
        ({"prompt": "2+2?", "answer": float("nan")}, "line 2: field 'answer' is nan, not a number an answer can be"),
        ({"prompt": "2+2?", "answer": float("inf")}, "line 2: field 'answer' is inf, not a number an answer can be"),
        ({"prompt": "", "answer": "4"}, "line 2: field 'prompt' is empty"),
        (
            {"messages": [{"role": "assistant", "content": "4"}], "answer": "4"},
            "line 2: field 'messages' has no turn before the assistant's",
        ),
        (
            {"question": "2+2?", "answer": "4"},
            "line 2: no prompt: a row needs 'prompt' (a string or chat messages) or 'messages', and 'answer'",
        ),
    ],
)
def test_a_bad_row_is_refused_naming_its_line_and_field(tmp_path, capsys, bad, message):
    source = problems(tmp_path, {"prompt": "1+1?", "answer": "2"}, bad, {"prompt": "3+3?", "answer": "6"})
    assert refused(capsys, str(tmp_path / "out"), "--problems", source, "--test", "1") == f"{source}: {message}"


def test_a_parquet_file_is_refused_as_not_jsonl(tmp_path, capsys):
    data.main([str(tmp_path / "made"), "--train", "3", "--test", "1"])
    source = str(tmp_path / "made" / "train.parquet")
    assert refused(capsys, str(tmp_path / "out"), "--problems", source) == (
        f"{source}: a parquet file; --problems expects a JSONL file of rows with 'prompt' or 'messages'"
    )


def test_a_byte_order_mark_is_read_past_as_every_jsonl_reader_reads_it(tmp_path):
    """Some Windows editors save one: every reader refused its first line ("Unexpected UTF-8 BOM")."""
    source = problems(
        tmp_path, raw=b'\xef\xbb\xbf{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?", "answer": "4"}\n'
    )
    data.main([str(tmp_path / "out"), "--problems", source, "--test", "1"])
    test = pd.read_parquet(tmp_path / "out" / "test.parquet")
    assert list(test["prompt"][0]) == [{"role": "user", "content": "1+1?"}]


def test_too_few_problems_and_a_missing_file(tmp_path, capsys):
    source = problems(tmp_path, {"prompt": "1+1?", "answer": "2"})
    assert refused(capsys, str(tmp_path / "out"), "--problems", source) == (
        f"{source}: 1 problems; --test 128 leaves none to train on"
    )
    missing = str(tmp_path / "missing.jsonl")
    assert refused(capsys, str(tmp_path / "out"), "--problems", missing) == f"{missing}: No such file or directory"
    empty = problems(tmp_path, raw=b"")  # it said "0 problems; --test 128 leaves none to train on"
    assert refused(capsys, str(tmp_path / "out"), "--problems", empty) == f"{empty}: no rows"


def test_an_integer_longer_than_python_reads_is_named_by_its_line(tmp_path, capsys):
    source = problems(
        tmp_path, raw=b'{"prompt": "1+1?", "answer": "2"}\n{"prompt": "x", "answer": 9' + b"9" * 5000 + b"}\n"
    )
    assert refused(capsys, str(tmp_path / "out"), "--problems", source, "--test", "1").startswith(
        f"{source}: line 2: a number too long to read (Exceeds the limit"
    )


@pytest.mark.parametrize("flags", [["--train", "5"], ["--seed", "3"]])
def test_the_synthetic_tasks_settings_are_refused_with_problems(tmp_path, capsys, flags):
    """They were taken and ignored: every row but the first --test trained, whatever --train said."""
    source = problems(tmp_path, {"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"})
    message = refused(capsys, str(tmp_path / "out"), "--problems", source, "--test", "1", *flags, status=2)
    assert message == f"{flags[0]} set the synthetic problems; from --problems, every row but the first --test trains"
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no folder can be made")
def test_an_out_that_cannot_be_made_or_is_empty_is_refused_before_any_row_is_read(tmp_path, capsys):
    """/proc/x and "" were a FileNotFoundError traceback from os.makedirs, once the rows were made. The
    problems file here is missing: a refusal after reading it would name it instead."""
    missing = str(tmp_path / "missing.jsonl")
    cases = {
        "/proc/tw-verl-data": "cannot write a file in /proc (",
        "": "OUT must name a folder for train.parquet and test.parquet, not ''",
    }
    for out, message in cases.items():
        assert refused(capsys, out, "--problems", missing).startswith(message), out
        assert refused(capsys, out).startswith(message), out  # the synthetic task's rows
    assert os.listdir(tmp_path) == []
