"""Every command that reads a user's file answers a bad one with one line naming the file and line.

Each file holds random JSON rows (objects over the fields the project reads, with random
values) and at least one line that can be no row at all (bytes that are not UTF-8, text
that is not JSON, JSON that is not an object). The commands run in process through their
real entry points: ``threadweaver stats``, ``generate`` (on the embedded model), ``sft``,
``pgrpo``, verl's data script and the lm-eval tasks' data loader. Each must stop with a
one-line message that names the file and a line: never a traceback.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from threadweaver.cli import main as cli
from threadweaver.lmeval_tasks import data as lmeval_data
from threadweaver.quickstart.recipe import embedded_models
from threadweaver.verl_rollout import data as verl_data

pytestmark = pytest.mark.slow

FIELDS = [
    "id",
    "messages",
    "prompt",
    "completion",
    "text",
    "prompt_ids",
    "completion_ids",
    "token_ids",
    "answer",
    "injected",
    "degradations",
    "Problem",
    "Answer",
    "role",
    "content",
]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False), st.text(max_size=12))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELDS), inner, max_size=3)),
    max_leaves=8,
)
rows = st.dictionaries(st.sampled_from(FIELDS), values, max_size=4).map(lambda row: json.dumps(row).encode())


def blank(line: bytes) -> bool:
    """A line every reader skips (``threadweaver.jsonl.read_jsonl``): it is no bad row."""
    try:
        return not line.decode("utf-8").strip()
    except UnicodeDecodeError:
        return False


garbage = st.binary(min_size=1, max_size=20).filter(
    lambda b: b"\n" not in b and not blank(b) and not b.strip().startswith(b"{")
)
no_row = st.sampled_from([b"\xff\xfe not UTF-8", b"not JSON", b"[1, 2]", b'"a string"']) | garbage


@st.composite
def bad_files(draw) -> bytes:
    lines = draw(st.lists(rows, max_size=5))
    lines.insert(draw(st.integers(0, len(lines))), draw(no_row))
    return b"\n".join(lines) + b"\n"


def one_line_naming(message, path) -> None:
    assert isinstance(message, str) and "\n" not in message.strip(), message
    assert str(path) in message and re.search(r"\bline \d+", message), message


def exit_message(argv) -> str:
    with pytest.raises(SystemExit) as stopped:
        cli(argv)
    return stopped.value.code


FUZZ = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def model():
    return str(embedded_models()["parallel"])


@FUZZ
@given(content=bad_files())
def test_stats(tmp_path, content):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    one_line_naming(exit_message(["stats", str(path)]), path)


@FUZZ
@given(content=bad_files())
def test_generate(tmp_path, model, content):
    path = tmp_path / "problems.jsonl"
    path.write_bytes(content)
    argv = ["generate", str(path), str(tmp_path / "out.jsonl"), "--engine", "transformers", "--model", model]
    one_line_naming(exit_message([*argv, "--max-tokens", "8"]), path)


@FUZZ
@given(content=bad_files())
def test_sft(tmp_path, model, content):
    path = tmp_path / "train.jsonl"
    path.write_bytes(content)
    one_line_naming(
        exit_message(["sft", model, str(path), "--output-dir", str(tmp_path / "out"), "--max-steps", "1"]), path
    )


@FUZZ
@given(content=bad_files())
def test_pgrpo(tmp_path, model, content):
    path = tmp_path / "problems.jsonl"
    path.write_bytes(content)
    argv = ["pgrpo", model, str(path), "--output-dir", str(tmp_path / "out"), "--max-steps", "1"]
    one_line_naming(exit_message(argv), path)


@FUZZ
@given(content=bad_files())
def test_verl_data(tmp_path, capsys, content):
    path = tmp_path / "problems.jsonl"
    path.write_bytes(content)
    with pytest.raises(SystemExit) as stopped:
        verl_data.main([str(tmp_path / "out"), "--problems", str(path), "--test", "1"])
    assert stopped.value.code != 0
    one_line_naming(capsys.readouterr().err, path)


@FUZZ
@given(content=bad_files())
def test_lmeval_data_loader(tmp_path, content):
    path = tmp_path / "tw_aime24.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError) as failed:
        lmeval_data.load("tw_aime24", "Problem", "Answer", tw_aime24_file=str(path))
    one_line_naming(str(failed.value), path)
