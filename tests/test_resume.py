"""Resuming from a damaged output file never loses a finished row (hypothesis).

A run is cut after some rows, the file is damaged at random (truncated at any byte, a
garbage line anywhere, a row repeated, emptied, a line made not UTF-8), and the run is
resumed: every (id, sample) ends up exactly once, and every finished row the damage left
whole is still there, byte for byte.
"""

import asyncio
import codecs
import json

import pytest
from chars import char_format
from hypothesis import given, settings
from hypothesis import strategies as st
from orchestrator_scripts import GOOD, PROMPT

from threadweaver.batch import Job, run_batch
from threadweaver.jsonl import SET_ASIDE, RowError, appending, finished_keys, read_jsonl
from threadweaver.orchestrator import Orchestrator
from threadweaver.testing import ScriptedEngine

FMT = char_format()
JOBS = [Job(f"p{i}", sample, tuple(FMT.encode(PROMPT)), {}) for i in range(3) for sample in range(2)]


def decode(jobs, path) -> None:
    asyncio.run(run_batch(jobs, Orchestrator(ScriptedEngine(FMT, GOOD), FMT), str(path), concurrency=2))


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[bytes]:
    """The whole output of an undisturbed run, one row a line."""
    path = tmp_path_factory.mktemp("full") / "out.jsonl"
    decode(JOBS, path)
    return path.read_bytes().splitlines(keepends=True)


garbage = st.one_of(st.binary(max_size=30).filter(lambda b: b"\n" not in b), st.just(b'{"id": "p0"'), st.just(b"[]"))


@st.composite
def damages(draw, rows):
    """(damaged file, the finished rows it still holds whole)."""
    finished = rows[: draw(st.integers(0, len(rows)))]
    kind = draw(st.sampled_from(["truncate", "garbage", "repeat", "empty", "not utf-8"]))
    if kind == "truncate":
        data = b"".join(finished)
        cut = draw(st.integers(0, len(data)))
        whole = []
        for row in finished:  # the rows before the cut: a later, shorter row is not whole either
            if sum(map(len, whole)) + len(row) > cut:
                break
            whole.append(row)
        return data[:cut], whole
    if kind == "empty":
        return b"", []
    lines = list(finished)
    if kind == "garbage":
        lines.insert(draw(st.integers(0, len(lines))), draw(garbage) + b"\n")
        return b"".join(lines), finished
    if kind == "repeat" and finished:
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(finished)))
        return b"".join(lines), finished
    if kind == "not utf-8" and finished:
        i = draw(st.integers(0, len(lines) - 1))
        lines[i] = lines[i][:5] + b"\xff\xfe" + lines[i][5:]
        return b"".join(lines), finished[:i] + finished[i + 1 :]
    return b"".join(lines), finished


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_resumed_run_keeps_every_finished_row_and_finishes_each_once(rows, tmp_path_factory, data):
    damaged, whole = data.draw(damages(rows))
    path = tmp_path_factory.mktemp("resume") / "out.jsonl"
    path.write_bytes(damaged)
    if not whole and any(line.strip() for line in damaged.split(b"\n")[:-1]):
        with pytest.raises(ValueError, match="holds no finished row"):  # nothing to resume: not an output
            finished_keys(str(path))
        assert path.read_bytes() == damaged
        return
    done, _ = finished_keys(str(path))
    decode([j for j in JOBS if (j.row_id, j.sample) not in done], path)
    final = path.read_bytes().splitlines(keepends=True)
    keys = [(row["id"], row["sample"]) for row in map(json.loads, final)]
    assert sorted(keys) == sorted((j.row_id, j.sample) for j in JOBS)
    assert all(row in final for row in whole)


def test_what_is_set_aside_is_named_and_kept_byte_for_byte(tmp_path):
    path = tmp_path / "out.jsonl"
    decode(JOBS[:2], path)
    first, second = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(first + b"not json\n" + first + b"\xff\n" + second.rstrip(b"\n"))
    done, set_aside = finished_keys(str(path))
    assert done == {("p0", 0), ("p0", 1)} and set_aside == 3
    assert path.read_bytes() == first + second
    assert (tmp_path / f"out.jsonl{SET_ASIDE}").read_bytes() == b"not json\n" + first + b"\xff\n"


def test_appending_after_a_crash_starts_a_line_of_its_own(tmp_path):
    path = tmp_path / "rows.jsonl"
    for tail in (b'{"id": "a"', b'{"id": "a"}', b""):  # torn, whole without its newline, nothing
        path.write_bytes(b'{"id": "z"}\n' + tail)
        with appending(str(path)) as append:
            append({"id": "b"})
        expected = [{"id": "z"}, *([{"id": "a"}] if tail == b'{"id": "a"}' else []), {"id": "b"}]
        assert [json.loads(line) for line in path.read_text().splitlines()] == expected


CUT_ROW = {"id": "a/1", "n": -12.5e-3, "t": True, "f": False, "z": None, "text": 'caf\u00e9 "q" \\ \n \U0001f600'}


@pytest.mark.parametrize("ensure_ascii", [True, False], ids=["escaped", "utf8"])
def test_a_row_cut_at_any_byte_is_a_torn_last_line_and_a_broken_one_is_not(tmp_path, ensure_ascii):
    """What ``stats`` and ``view`` leave out of a file still being written (``read_jsonl``'s ``on_torn``): a last
    line cut anywhere, inside a number, a literal, an escape or a UTF-8 character. A last line broken otherwise,
    or a cut one with its newline, is still refused: that is a user's file to fix, not one being written."""
    path, first = tmp_path / "rows.jsonl", b'{"id": "done"}\n'
    row = json.dumps(CUT_ROW, ensure_ascii=ensure_ascii).encode()
    for cut in range(1, len(row)):
        path.write_bytes(first + row[:cut])
        torn = []
        assert [r for _, r in read_jsonl(str(path), torn.append)] == [{"id": "done"}] and torn == [2], row[:cut]
    broken = [b'[{"a": 1}, {"a": 2}]', b"42", b'{"a": 1,, "b": 2}', b'{"a": tru}', b'{"a": 1.}', b'{"a": "\\q"}']
    for line in [*broken, b"caf\xe9", row[:20] + b"\n"]:
        path.write_bytes(first + line)
        with pytest.raises(RowError, match="^line 2: "):
            list(read_jsonl(str(path), lambda line: pytest.fail(f"{line} taken as torn")))


def test_a_byte_order_mark_before_the_first_finished_row_is_read_past(tmp_path):
    """An OUT saved again by an editor that writes a BOM: its first row is still finished, not set aside."""
    path = tmp_path / "out.jsonl"
    decode(JOBS[:2], path)
    rows = path.read_bytes()
    for damaged in (codecs.BOM_UTF8 + rows, codecs.BOM_UTF8 + rows.rstrip(b"\n")):
        path.write_bytes(damaged)
        done, set_aside = finished_keys(str(path))
        assert done == {("p0", 0), ("p0", 1)} and set_aside == 0
        assert not (tmp_path / f"out.jsonl{SET_ASIDE}").exists()
