"""``threadweaver generate`` refuses bad input with one line, before any work, and loses nothing.

Run as a user runs it; the server URL is a closed port, so no server is ever reached.
"""

import json
import os
import subprocess

import pytest

from threadweaver.testing import CLI
from threadweaver.vllm_orchestrator.http import HTTPOptions

NO_SERVER = ["--base-url", "http://127.0.0.1:9", "--retries", "0"]
PROBLEMS = "".join(json.dumps({"id": f"p{i}", "prompt": f"What is {i} + 1?"}) + "\n" for i in range(3))


def generate(*args):
    """Exits with an error; a timeout (a hang) fails the test too."""
    result = subprocess.run([CLI, "generate", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from threadweaver.kit.tokenizers import qwen_tokenizer

    path = tmp_path_factory.mktemp("model")
    qwen_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture
def problems(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text(PROBLEMS)
    return path


def test_out_that_is_the_problems_file_is_refused_and_keeps_its_rows(problems, model, tmp_path):
    alias = tmp_path / "." / problems.name
    stderr = generate(str(problems), str(alias), "--model", model, *NO_SERVER)
    assert f"{alias} is the input file {problems}; name another" in stderr
    assert problems.read_text() == PROBLEMS
    assert sorted(os.listdir(tmp_path)) == ["problems.jsonl"]


def test_an_output_that_holds_no_finished_row_is_refused_not_resumed(problems, model, tmp_path):
    """The two files swapped (`generate traj.jsonl problems.jsonl`): the problems stay where they are."""
    other = tmp_path / "other_problems.jsonl"
    other.write_text(PROBLEMS)
    stderr = generate(str(problems), str(other), "--model", model, *NO_SERVER)
    assert f"{other} holds no finished row: none of its 3 lines is a JSON object with an 'id' and a 'sample'" in stderr
    assert other.read_text() == PROBLEMS and sorted(os.listdir(tmp_path)) == ["other_problems.jsonl", "problems.jsonl"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--concurrency", "0"], "must be a whole number of at least 1, not 0"),
        (["--concurrency", "-1"], "must be a whole number of at least 1, not -1"),
        (["--max-inflight", "0"], "must be a whole number of at least 1, not 0"),
        (["--retries", "-1"], "must be a whole number of at least 0, not -1"),
        (["--n", "0"], "must be a whole number of at least 1, not 0"),
        (["--n", "-1"], "must be a whole number of at least 1, not -1"),
        (["--temperature", "-1"], "must be between 0 and 2, not -1.0"),
        (["--temperature", "nan"], "must be between 0 and 2, not nan"),
        (["--top-p", "5"], "must be more than 0 and at most 1, not 5.0"),
        (["--top-k", "-2"], "must be -1 or 0 (every token) or at least 1, not -2"),
        (["--base-url", "ftp://x"], "must be an http:// or https:// URL, not 'ftp://x'"),
        (
            ["--base-url", "http://a:1,http://b:2"],
            "must be one server's address (http://host:port), not "
            "'http://a:1,http://b:2'; give several space-separated",
        ),
    ],
)
def test_settings_out_of_their_range_name_the_flag(problems, model, tmp_path, flags, message):
    stderr = generate(str(problems), str(tmp_path / "out.jsonl"), "--model", model, *NO_SERVER, *flags)
    assert stderr.strip() == f"threadweaver generate: {flags[0]} {message}"
    assert problems.read_text() == PROBLEMS and not (tmp_path / "out.jsonl").exists()


def test_a_model_that_cannot_be_one_is_named_before_anything_loads(problems, model, tmp_path):
    """A tokenizer's folder is enough for a server's engine; the in-process engines load the weights too."""
    cases = {
        (str(tmp_path / "nomodel"),): f"{tmp_path / 'nomodel'}: no such directory (a hub id reads org/name)",
        (str(problems),): f"{problems}: a file, not a model directory",
        (model, "--engine", "transformers"): f"{model}: not a model directory (no config.json)",
    }
    for flags, message in cases.items():
        stderr = generate(str(problems), str(tmp_path / "out.jsonl"), *NO_SERVER, "--model", *flags)
        assert stderr.strip() == f"threadweaver generate: {message}"
    assert not (tmp_path / "out.jsonl").exists()


def test_an_in_process_engine_without_a_model_names_the_flag(problems, tmp_path):
    stderr = generate(str(problems), str(tmp_path / "out.jsonl"), "--engine", "transformers")
    assert stderr.strip().endswith(
        "the transformers engine runs in-process and needs a model directory: --model DIR "
        "(model=DIR in lm-eval's --model_args)"
    )


def test_a_null_id_is_no_id(tmp_path):
    """Rows are named by their line where they have no id; a null one was the id 'None' (two were duplicates)."""
    from threadweaver.batch import read_problems

    path = tmp_path / "p.jsonl"
    path.write_text('{"id": null, "prompt": "a"}\n{"id": null, "prompt": "b"}\n{"id": 0, "prompt": "c"}\n')
    assert [row_id for _, row_id, _ in read_problems(str(path))] == ["line-1", "line-2", "0"]


def test_http_options_refuse_a_count_that_would_wait_forever():
    with pytest.raises(ValueError, match="max_inflight must be a whole number of at least 1, not 0"):
        HTTPOptions(max_inflight=0)


def test_an_empty_problems_file_says_so(model, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    stderr = generate(str(empty), str(tmp_path / "out.jsonl"), "--model", model, *NO_SERVER)
    assert stderr.strip() == f"threadweaver generate: {empty} has no problems"


def test_a_missing_problems_file_is_named_before_any_server_is_asked(tmp_path):
    missing, out = tmp_path / "nope.jsonl", tmp_path / "out.jsonl"
    stderr = generate(str(missing), str(out), *NO_SERVER)
    assert stderr.strip() == f"threadweaver generate: cannot read {missing}: No such file or directory"
    assert not out.exists()


def test_a_bad_prompt_is_refused_before_the_output_is_touched(model, tmp_path):
    bad, out = tmp_path / "bad.jsonl", tmp_path / "out.jsonl"
    bad.write_text(json.dumps({"id": "a", "question": "Q?"}) + "\n")
    kept = '{"id": "p0", "sample": 0}\nnot a row\n'
    out.write_text(kept)
    stderr = generate(str(bad), str(out), "--model", model, *NO_SERVER)
    assert f"{bad}: line 1: no prompt" in stderr
    assert out.read_text() == kept and not (tmp_path / "out.jsonl.set-aside").exists()


def test_a_model_without_the_tags_says_how_to_prepare_it_before_the_output_is_touched(problems, tmp_path):
    """It said to call ``add_tags`` in Python, and only after it had set aside the output's unfinished lines."""
    from threadweaver.kit.tokenizers import qwen_tokenizer

    untagged, out = tmp_path / "untagged", tmp_path / "out.jsonl"
    qwen_tokenizer(tags=False).save_pretrained(untagged)
    kept = '{"id": "p0", "sample": 0}\nnot a row\n'
    out.write_text(kept)
    stderr = generate(str(problems), str(out), "--model", str(untagged), "--no-branching", *NO_SERVER)
    assert stderr.startswith("threadweaver generate: the model's tokenizer has no single token for <Parallel>, ")
    assert stderr.endswith(
        f"`threadweaver prepare {untagged} DIR` adds the tags (then serve DIR); generate needs them with --no-branching"
        " too\n"
    )
    assert out.read_text() == kept and not (tmp_path / "out.jsonl.set-aside").exists()


def test_an_in_process_engine_checks_the_tags_before_it_loads_the_weights(problems, tmp_path):
    """It loaded the model first: here there are no weights to load, so a weights error came instead."""
    from transformers import Qwen3Config

    from threadweaver.kit.tokenizers import qwen_tokenizer

    untagged, out = tmp_path / "untagged", tmp_path / "out.jsonl"
    qwen_tokenizer(tags=False).save_pretrained(untagged)
    Qwen3Config().save_pretrained(untagged)  # and no weights file
    stderr = generate(str(problems), str(out), "--model", str(untagged), "--engine", "transformers")
    assert stderr.startswith("threadweaver generate: the model's tokenizer has no single token for <Parallel>, ")
    assert "adds the tags (then give --model DIR); generate needs them with --no-branching too" in stderr
    assert not out.exists()


def test_an_unreachable_server_is_an_error_under_a_short_timeout_too(problems, model, tmp_path):
    """It once wrote every trajectory as cut at --timeout-s, empty, while its first request was still retrying:
    a rerun then skipped them all as finished."""
    out = tmp_path / "out.jsonl"
    stderr = generate(str(problems), str(out), *NO_SERVER, "--model", str(model), "--timeout-s", "0.001")
    assert "cannot reach the vLLM server at http://127.0.0.1:9" in stderr
    assert not out.exists() or out.read_text() == ""
    two = ["--base-url", "http://127.0.0.1:9 http://127.0.0.1:9", "--retries", "0"]  # replicas: each is asked
    stderr = generate(str(problems), str(out), *two, "--model", str(model), "--timeout-s", "0.001")
    assert "cannot reach the vLLM server at http://127.0.0.1:9" in stderr
    assert not out.exists() or out.read_text() == ""


def test_an_unreachable_server_points_to_finished_trajectories_only_where_there_are_some(problems, tmp_path):
    out = tmp_path / "out.jsonl"
    stderr = generate(str(problems), str(out), *NO_SERVER)
    assert "cannot reach the vLLM server at http://127.0.0.1:9" in stderr
    assert "finished trajectories" not in stderr
    finished = json.dumps({"id": "p0", "sample": 0}) + "\n"
    out.write_text(finished)
    stderr = generate(str(problems), str(out), *NO_SERVER)
    assert f"finished trajectories are in {out}; rerun the same command to resume" in stderr
    assert out.read_text() == finished and problems.read_text() == PROBLEMS
