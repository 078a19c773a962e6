"""The viewer's Python side: critical paths, the token schedule, what a row carries to the page, its errors.

The page itself runs in a real browser in integration_tests/test_view_page.py.
"""

import asyncio
import base64
import gzip
import json
import os
import re
import subprocess

import pytest
from orchestrator_scripts import CASES, GOOD, NESTED, PROMPT, WELL_FORMED

from threadweaver.batch import trajectory_row
from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.rows import RowReader
from threadweaver.testing import CLI, ScriptedEngine
from threadweaver.tree import parse
from threadweaver.trie import trajectory_trie
from threadweaver.view import Reader, critical_requests, file_page


def decoded(fmt, script, limits=Limits(), **head):
    trajectory = asyncio.run(Orchestrator(ScriptedEngine(fmt, script), fmt, limits).run(fmt.encode(PROMPT)))
    row = trajectory_row(trajectory, fmt, 0.5, limits, id="p", sample=0, **head)
    return json.loads(json.dumps(row)), trajectory  # as a file holds it


def details(blob: str) -> dict:
    return json.loads(gzip.decompress(base64.b64decode(blob)))


def payload(html: str) -> dict:
    data = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S).group(1)
    return json.loads(data.replace("<\\/", "</"))


@pytest.mark.parametrize("script", [GOOD, NESTED], ids=["flat", "nested"])
def test_critical_path_of_the_requests_is_the_orchestrators_token_latency(fmt, script):
    row, trajectory = decoded(fmt, script)
    marked = critical_requests(row["requests"], row["stats"])
    tokens = sum(row["requests"][i]["completion_tokens"] for i in marked)
    assert tokens == trajectory.stats.critical_path_tokens
    assert tokens < trajectory.stats.total_tokens
    paths = {tuple(map(tuple, row["requests"][i]["thread_path"])) for i in marked}
    if script is GOOD:  # thread 2 ("bbbb") outlasts thread 1 ("aa")
        assert paths == {(), ((0, 2),)}
    else:  # thread 1 with its nested block outlasts thread 2; inside it, thread 1.1 outlasts 1.2
        assert trajectory.stats.max_depth == 2
        assert paths == {(), ((0, 1),), ((0, 1), (0, 1))}


@pytest.mark.parametrize("script", [GOOD, NESTED], ids=["flat", "nested"])
def test_a_row_shows_what_the_orchestrator_recorded(fmt, script):
    row, trajectory = decoded(fmt, script, answer="42")
    summary, blob = Reader(RowReader(None, fmt)).row(row, 7, 0)
    stats = trajectory.stats
    assert (summary["critical"], summary["total"], summary["blocks"]) == (
        stats.critical_path_tokens,
        stats.total_tokens,
        stats.blocks,
    )
    assert summary["speedup"] == pytest.approx(stats.speedup, abs=1e-4)
    assert (summary["line"], summary["id"], summary["well_formed"], summary["correct"]) == (7, "p", True, False)
    d = details(blob)
    assert d["ids"] == list(trajectory.token_ids) and d["prompt"] == list(trajectory.prompt_ids)
    assert d["injected"] == row["injected"] and d["injected"]
    assert d["timeline"]["measured"] and d["timeline"]["requests"] == row["requests"]
    assert d["timeline"]["critical"] == critical_requests(row["requests"], row["stats"])


@pytest.mark.parametrize("script", [GOOD, NESTED], ids=["flat", "nested"])
def test_without_timings_the_schedule_in_tokens_has_the_token_latency_as_its_critical_path(fmt, script):
    row, trajectory = decoded(fmt, script)
    del row["requests"]
    _, blob = Reader(RowReader(None, fmt)).row(row, 1, 0)
    timeline = details(blob)["timeline"]
    requests = timeline["requests"]
    assert not timeline["measured"]
    assert sum(r["completion_tokens"] for r in requests) == trajectory.stats.total_tokens
    assert sum(requests[i]["completion_tokens"] for i in timeline["critical"]) == trajectory.stats.critical_path_tokens
    assert max(r["ended"] for r in requests) == trajectory.stats.critical_path_tokens
    lanes = {tuple(map(tuple, r["thread_path"])) for r in requests}
    assert lanes == {tuple(map(tuple, r["thread_path"])) for r in decoded(fmt, script)[0]["requests"]}


def test_a_serial_run_has_every_request_on_its_critical_path(fmt):
    row, trajectory = decoded(fmt, NESTED, Limits(concurrent_threads=False))
    summary, blob = Reader(RowReader(None, fmt)).row(row, 1, 0)
    assert summary["speedup"] == 1.0 and summary["critical"] == trajectory.stats.total_tokens
    assert details(blob)["timeline"]["critical"] == list(range(len(row["requests"])))


@pytest.mark.parametrize("case", ["EOS inside a thread", "too many threads", "a thread never closes"])
def test_a_degraded_row_carries_each_degradation_at_its_position(fmt, case):
    script, limits, _ = CASES[case]
    row, trajectory = decoded(fmt, script, limits)
    summary, blob = Reader(RowReader(None, fmt)).row(row, 1, 0)
    assert trajectory.degradations
    assert summary["kinds"] == sorted(trajectory.degradation_kinds) and not summary["well_formed"]
    expected = [(d.position, d.kind, str(d)) for d in trajectory.degradations]
    assert [(f["position"], f["kind"], f["text"]) for f in details(blob)["faults"]] == expected


def test_a_training_row_carries_its_trie_as_the_collator_builds_it(qwen):
    reader = RowReader(qwen)
    fmt = reader.fmt
    nested = WELL_FORMED.replace("<Thread>1:aa</Thread>", "<Thread>1:x" + NESTED_BLOCK + "y</Thread>")
    row = {"id": "n", "messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": nested}]}
    summary, blob = Reader(reader).row(row, 3, 0)
    d = details(blob)
    prompt, ids = reader.prompt(row), reader.trajectory(row)
    trie = trajectory_trie(prompt, parse(ids, fmt).nodes, fmt, train_injected=True)
    assert d["trie"]["ids"] == trie.input_ids and d["trie"]["end"] == trie.subtree_end
    assert d["trie"]["parent"] == trie.parent and d["trie"]["trained"] == [int(t) for t in trie.trained]
    assert d["trie"]["prompt"] == len(prompt) and d["injected"] == []
    assert summary["blocks"] == 2 and summary["threads"] == [2, 2] and summary["well_formed"]
    assert summary["correct"] is None  # no answer to grade against


NESTED_BLOCK = "<Parallel><Outlines><Outline>1:c</Outline><Outline>2:d</Outline></Outlines>" + (
    "<Thread>1:cc</Thread><Thread>2:ddd</Thread></Parallel>"
)


def test_token_ids_that_do_not_decode_to_the_rows_text_ask_for_the_tokenizer(fmt, tmp_path):
    row, _ = decoded(fmt, GOOD)
    row["text"] = "something else"
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(decoded(fmt, GOOD)[0]) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"rows.jsonl: line 2: .*give the model's tokenizer with --tokenizer"):
        file_page([str(path)], RowReader(None, fmt))


def test_view_writes_one_page_of_every_row_with_the_stats_commands_numbers(tmp_path):
    subprocess.run([CLI, "synth", "--out", str(tmp_path), "--train", "5", "--validation", "12"], check=True)
    rows = tmp_path / "parallel" / "validation.jsonl"
    done = subprocess.run([CLI, "view", str(rows), "--out", str(tmp_path / "page.html")], capture_output=True)
    assert done.returncode == 0, done.stderr
    data = payload((tmp_path / "page.html").read_text())
    stats = json.loads(subprocess.run([CLI, "stats", str(rows), "--json"], capture_output=True, check=True).stdout)
    assert len(data["rows"]) == len(data["details"]) == 12
    for shown, counted in zip(data["rows"], stats["rows"], strict=True):
        assert shown["critical"] == counted["critical_path_tokens"] and shown["total"] == counted["total_tokens"]
        assert shown["correct"] is True and shown["speedup"] > 1
    html = (tmp_path / "page.html").read_text().replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "http://" not in html and "https://" not in html  # nothing to fetch (the browser test runs it offline)


def test_view_names_the_file_and_line_of_a_bad_row_and_writes_nothing(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "a", "prompt": "1+1=?", "completion": "2"}\n{"id": "b", "prompt": "2+2=?"}\n')
    out = tmp_path / "page.html"
    done = subprocess.run([CLI, "view", str(path), "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 1 and not out.exists()
    assert f"threadweaver view: {path}: line 2: no trajectory" in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run([CLI, "view", str(path), str(path), str(path)], capture_output=True, text=True)
    assert done.returncode == 2 and "one file, or two side by side" in done.stderr
    (tmp_path / "empty.jsonl").write_text("\n")
    done = subprocess.run(
        [CLI, "view", str(tmp_path / "empty.jsonl"), "--out", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 1 and done.stderr == f"threadweaver view: {tmp_path / 'empty.jsonl'}: no rows to show\n"
    assert not out.exists()


def test_stats_and_view_of_a_file_being_written_leave_its_torn_last_line_out_and_say_so(tmp_path):
    """``generate`` appends a row at a time: ``stats`` or ``view`` run meanwhile may read half a row at the
    end. Both stopped at it (``line 13: not JSON``); they now show the finished rows and say, after the progress
    bar, what they left out. A cut line that has its newline is still refused: it is no row being written."""
    subprocess.run([CLI, "synth", "--out", str(tmp_path), "--train", "5", "--validation", "12"], check=True)
    rows = tmp_path / "rows.jsonl"
    finished = (tmp_path / "parallel" / "validation.jsonl").read_text()
    rows.write_text(finished + finished.splitlines()[0][:40])
    note = f"{rows}: line 13 is torn (cut off mid-row, no newline): left out; is the file still being written?\n"
    stats = subprocess.run([CLI, "stats", str(rows), "--json"], capture_output=True, text=True)
    assert stats.returncode == 0 and json.loads(stats.stdout)["summary"]["rows"] == 12
    assert stats.stderr == f"threadweaver stats: {note}"
    view = subprocess.run(
        [CLI, "view", str(rows), "--out", str(tmp_path / "page.html")], capture_output=True, text=True
    )
    assert view.returncode == 0 and len(payload((tmp_path / "page.html").read_text())["rows"]) == 12
    assert f"threadweaver view: {note}" in view.stderr
    rows.write_text(rows.read_text() + "\n")
    for command in ("stats", "view"):
        done = subprocess.run([CLI, command, str(rows)], capture_output=True, text=True)
        assert done.returncode == 1 and "line 13: not JSON (" in done.stderr, command


@pytest.mark.parametrize("injected", [[10_000], "3", [True]], ids=["outside", "not a list", "not positions"])
def test_view_and_stats_refuse_the_same_bad_injected_field(fmt, tmp_path, injected):
    """Both read generate rows through one reader (threadweaver.decoded): one rule, one message."""
    from threadweaver.report import file_stats

    row, _ = decoded(fmt, GOOD)
    row["injected"] = injected
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    reader = RowReader(None, fmt)
    with pytest.raises(ValueError, match=r"line 1: field 'injected'") as from_view:
        file_page([str(path)], reader)
    with pytest.raises(ValueError, match=r"line 1: field 'injected'") as from_stats:
        list(file_stats(str(path), reader))
    assert str(from_view.value).endswith(str(from_stats.value))


def test_a_recorded_grade_is_shown_as_it_is(fmt):
    """lm-eval's trajectories rows carry the grade lm-eval computed on the response it scored."""
    row, _ = decoded(fmt, GOOD, answer="42")
    assert Reader(RowReader(None, fmt)).row(row, 1, 0)[0]["correct"] is False  # graded here against the text
    row["correct"] = True
    assert Reader(RowReader(None, fmt)).row(row, 1, 0)[0]["correct"] is True


GOOD_IDS = {"id": "a", "prompt_ids": [5], "token_ids": [5]}
"""A row of token ids the synth tokenizer (the command's default) reads."""


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"prompt_ids": "abc"}, "field 'prompt_ids' must be a non-empty list of token ids"),
        ({"prompt_ids": [-1]}, "field 'prompt_ids' holds token id -1 at position 0: ids are not negative"),
        ({"prompt_ids": [10**30]}, f"field 'prompt_ids' holds token id {10**30} at position 0, outside the"),
        ({"token_ids": [5, -1]}, "field 'token_ids' holds token id -1 at position 1: ids are not negative"),
        ({"requests": [{}]}, "field 'requests' must be a list of {thread_path, started, ended, completion_tokens}"),
        ({"requests": 5}, "field 'requests' must be a list of {thread_path, started, ended, completion_tokens}"),
    ],
    ids=["prompt not ids", "negative prompt id", "huge prompt id", "negative trajectory id", "request", "requests"],
)
def test_view_names_the_line_and_field_of_bad_ids_and_requests(tmp_path, bad, message):
    from threadweaver.cli import main

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(GOOD_IDS) + "\n" + json.dumps({**GOOD_IDS, **bad}) + "\n")
    with pytest.raises(SystemExit) as exit_:
        main(["view", str(path), "--out", str(tmp_path / "page.html")])
    assert f"{path}: line 2: {message}" in str(exit_.value.code) and "\n" not in str(exit_.value.code)
    assert not (tmp_path / "page.html").exists()


def test_view_filter_and_stats_read_a_row_nested_a_thousand_deep_as_one_malformed_row(tmp_path, capsys):
    """The lenient parse keeps a block past ``max_depth`` as text without descending into it: such a row stopped
    all three at Python's recursion limit ("blocks nested too deep to read"), the rows after it unread."""
    from threadweaver.cli import main

    deep = (
        "<Parallel><Outlines><Outline>1:A</Outline></Outlines><Thread>1:" * 1000 + "1" + "</Thread></Parallel>" * 1000
    )
    good = "<Parallel><Outlines><Outline>1:A</Outline></Outlines><Thread>1:2</Thread></Parallel>\\boxed{1}"
    path = tmp_path / "rows.jsonl"
    rows = [
        {"id": "deep", "prompt": "1", "completion": deep, "answer": "1"},
        {"id": "good", "prompt": "1", "completion": good, "answer": "1"},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    main(["stats", str(path), "--json"])
    stats = json.loads(capsys.readouterr().out)["rows"]
    assert [row["id"] for row in stats] == ["deep", "good"] and stats[1]["faults"] == []
    assert stats[0]["faults"] == [
        "token 33 (<Parallel>): parallel block nested 4 deep; max_depth is 3: kept as sequential text"
    ]
    main(["view", str(path), "--out", str(tmp_path / "page.html")])
    assert [row["well_formed"] for row in payload((tmp_path / "page.html").read_text())["rows"]] == [False, True]
    main(["filter", str(path), str(tmp_path / "kept.jsonl")])
    report = json.loads((tmp_path / "kept.jsonl.report.json").read_text())
    assert [(row["id"], row["reason"]) for row in report["dropped_rows"]] == [("deep", "malformed")]
    assert [row["id"] for row in map(json.loads, (tmp_path / "kept.jsonl").read_text().splitlines())] == ["good"]


def test_a_turn_the_chat_template_cannot_render_is_the_rows_fault_a_template_that_does_not_compile_the_tokenizers():
    from threadweaver.jsonl import FieldError
    from threadweaver.kit.tokenizers import synth_tokenizer
    from threadweaver.rows import RowReader

    tokenizer = synth_tokenizer()
    reader = RowReader(tokenizer)
    with pytest.raises(FieldError, match="field 'messages': the chat template cannot render this conversation"):
        reader.prompt({"messages": [{"role": "user"}, {"role": "assistant", "content": "4"}]})
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }"
    with pytest.raises(ValueError, match="field 'messages': the tokenizer's chat template does not compile") as err:
        reader.prompt({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "4"}]})
    assert not isinstance(err.value, FieldError)


BAD_SECOND_ROW = json.dumps(GOOD_IDS) + "\n" + json.dumps({"id": "b", "prompt_ids": "abc"}) + "\n"
"""Rows a command that reads them refuses at line 2: a refusal that names something else came before any row."""


def view(*argv: str) -> str:
    """What ``threadweaver view`` exits with (its one line, or argparse's status)."""
    from threadweaver.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["view", *argv])
    return exit_.value.code


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no file can be made")
def test_view_refuses_an_out_where_no_file_can_be_made_before_reading_the_rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(BAD_SECOND_ROW)
    said = view(str(path), "--out", "/proc/threadweaver-view.html")  # root may write anywhere else
    assert said == "threadweaver view: --out /proc/threadweaver-view.html: cannot write a file in /proc " + (
        "(No such file or directory)"
    )
    assert os.listdir(tmp_path) == ["rows.jsonl"]


def test_view_refuses_a_port_in_use_before_reading_the_rows(tmp_path):
    import socket

    path = tmp_path / "rows.jsonl"
    path.write_text(BAD_SECOND_ROW)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said = view(str(path), "--serve", "--port", str(port))
    assert said == f"threadweaver view: port {port} is in use: give another --port, or none for a free one"


@pytest.mark.parametrize(
    "flags, message",
    [(["--port", "8000"], "--port is the port of --serve"), (["--serve", "--out", "p.html"], "--out writes the page")],
    ids=["port without serve", "out with serve"],
)
def test_view_refuses_a_flag_it_would_ignore_as_a_usage_error(tmp_path, capsys, flags, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(GOOD_IDS) + "\n")
    assert view(str(path), *flags) == 2
    assert f"threadweaver view: error: {message}" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["rows.jsonl"]


def test_view_says_a_missing_file_or_a_folder_in_one_line_as_filter_does(tmp_path):
    missing = tmp_path / "nothing.jsonl"
    assert view(str(missing)) == f"threadweaver view: {missing}: no such file"
    assert view(str(tmp_path)) == f"threadweaver view: {tmp_path}: a folder, not a file of rows"


def tokenizer_folder(folder, edit=None):
    """A copy of the embedded models' tokenizer files (no model), its tokenizer.json changed by ``edit``."""
    import shutil

    source = os.path.join(os.path.dirname(__file__), "..", "apps", "quickstart", "models", "parallel")
    folder.mkdir()
    for name in os.listdir(source):
        if name != "model.safetensors" and not name.startswith("config"):
            shutil.copy(os.path.join(source, name), folder / name)
    if edit:
        data = json.loads((folder / "tokenizer.json").read_text())
        edit(data)
        (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


def swap_two_digits(data):
    vocab = data["model"]["vocab"]
    vocab["0"], vocab["1"] = vocab["1"], vocab["0"]


def test_view_reads_two_files_whose_rows_name_one_tokenizer_in_two_folders_and_refuses_different_ones(tmp_path):
    folders = [tokenizer_folder(tmp_path / name) for name in ("parallel", "sequential")]
    files = []
    for k, folder in enumerate([*folders, tokenizer_folder(tmp_path / "other", swap_two_digits)]):
        files.append(tmp_path / f"rows{k}.jsonl")
        files[-1].write_text(json.dumps({**GOOD_IDS, "tokenizer": str(folder)}) + "\n")
    from threadweaver.cli import main

    out = tmp_path / "page.html"
    main(["view", str(files[0]), str(files[1]), "--out", str(out)])
    assert len(payload(out.read_text())["rows"]) == 2
    said = view(str(files[0]), str(files[2]), "--out", str(tmp_path / "other.html"))
    assert said.startswith("threadweaver view: the files were written with different tokenizers (")
    assert said.endswith("): pass --tokenizer")


def test_view_names_the_file_and_line_that_record_a_tokenizer_that_is_gone(tmp_path):
    path = tmp_path / "rows.jsonl"
    gone = str(tmp_path / "moved" / "model")
    path.write_text("\n" + json.dumps({**GOOD_IDS, "tokenizer": gone}) + "\n")
    said = view(str(path))
    assert said.startswith(f"threadweaver view: {path}: line 2 records the tokenizer {gone!r}, which cannot be loaded")
    assert "\n" not in said
