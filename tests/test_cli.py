"""The threadweaver command line, run as a user runs it (the installed console script)."""

import asyncio
import json
import os
import signal
import subprocess
import time

import pytest

from threadweaver.testing import CLI, interrupted_once_written


def run(*args, check=True):
    return subprocess.run([CLI, *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    run("synth", "--out", str(out), "--train", "50", "--validation", "20", "--seed", "1")
    return out


def test_synth_writes_both_forms_and_a_recipe(data):
    recipe = json.loads((data / "recipe.json").read_text())
    assert recipe["seed"] == 1 and recipe["config"]["digits"] == 3
    for form in ("parallel", "sequential"):
        rows = [json.loads(line) for line in (data / form / "train.jsonl").read_text().splitlines()]
        assert len(rows) == 50
        assert [m["role"] for m in rows[0]["messages"]] == ["user", "assistant"]


def test_stats_into_a_reader_that_left_stops_quietly(data):
    """`threadweaver stats FILE | head -1`: the reader is gone before the table is written."""
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as a shell runs it
    proc = subprocess.Popen(
        [CLI, "stats", str(data / "parallel" / "train.jsonl")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=buffered,
    )
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait() == 1 and stderr == ""


def test_a_tokenizer_given_against_the_one_the_rows_record_is_warned_of(data):
    """``--tokenizer`` wins over what the rows record, with a warning: ids of another vocabulary would be
    read as other tokens. The same tokenizer by the same name, or its folder by another path, is not warned of."""
    rows = str(data / "parallel" / "validation.jsonl")  # rows that record 'synth'
    other = run("stats", rows, "--tokenizer", "qwen")
    assert f"warning: {rows} records the tokenizer 'synth'; reading it with --tokenizer 'qwen'" in other.stderr
    assert "warning" not in run("stats", rows, "--tokenizer", "synth").stderr


def test_stats_json_summaries(data):
    par = json.loads(run("stats", str(data / "parallel" / "validation.jsonl"), "--json").stdout)
    seq = json.loads(run("stats", str(data / "sequential" / "validation.jsonl"), "--json").stdout)
    assert par["summary"]["rows"] == 20 and par["summary"]["well_formed_ratio"] == 1.0
    assert par["summary"]["parallel_activation_ratio"] == 1.0 and par["summary"]["mean_speedup"] > 1.3
    assert seq["summary"]["mean_speedup"] == 1.0
    assert len(par["rows"]) == 20 and par["rows"][0]["critical_path_tokens"] < par["rows"][0]["total_tokens"]


def test_stats_table_and_token_ids_input(tmp_path):
    """The repeats of a problem each show their sample: without it, 8 rows all read tw_aime24/0."""
    path = tmp_path / "t.jsonl"
    rows = [{"id": "r1", "token_ids": [5, 6, 7]}, {"id": "r1", "sample": 1, "token_ids": [5, 6]}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = run("stats", str(path)).stdout.splitlines()
    assert out[0].split() == [
        "id",
        "sample",
        "total",
        "critical",
        "speedup",
        "ref.longest",
        "blocks",
        "threads",
        "faults",
    ]
    assert [line.split()[:3] for line in out[2:4]] == [["r1", "0", "3"], ["r1", "1", "2"]]
    assert "mean total tokens         2.5" in out
    assert [r["sample"] for r in json.loads(run("stats", str(path), "--json").stdout)["rows"]] == [0, 1]
    path.write_text(json.dumps({"id": "r1", "sample": "one", "token_ids": [5]}) + "\n")
    done = run("stats", str(path), check=False)
    assert done.returncode == 1 and done.stderr.endswith("line 1: field 'sample' must be a whole number, not 'one'\n")


@pytest.mark.parametrize("command", ["stats", "convert"])
def test_a_byte_order_mark_is_read_past(tmp_path, command):
    """A file saved with one (some Windows editors do): stats refused its first line ("Unexpected UTF-8 BOM"),
    convert dropped it as unreadable."""
    block = "<Parallel>\n<Outlines>\n<Outline>1: A</Outline>\n<Outline>2: B</Outline>\n</Outlines>\n"
    block += "<Thread>\n1: a.\n</Thread><Thread>\n2: b.\n</Thread>\n</Parallel>"
    chat = f"<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n<think>\n{block}\nSo.\n</think>\n\n2<|im_end|>\n"
    path = tmp_path / "bom.jsonl"
    row = {"id": "r1", "uuid": "r1", "text": block, "qwen_text": chat}
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(row).encode() + b"\n")
    if command == "stats":
        assert json.loads(run("stats", str(path), "--json", "--tokenizer", "qwen").stdout)["rows"][0]["id"] == "r1"
    else:
        out = tmp_path / "out.jsonl"
        run("convert", str(path), str(out), "--from", "reference", "--tokenizer", "qwen")
        assert json.loads(out.read_text())["id"] == "r1"


def test_a_json_document_over_several_lines_is_said_to_be_no_rows(tmp_path):
    """``pgrpo MODEL recipe.json`` said only ``line 1: not JSON``, of a file that is JSON."""
    path = tmp_path / "recipe.json.txt"
    path.write_text(json.dumps({"task": "threadweaver.synth", "seed": 0}, indent=1) + "\n")
    done = run("stats", str(path), check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "line 1: not JSON (" in done.stderr and done.stderr.endswith(
        "; rows are JSONL, one JSON object per line, not a JSON document over several lines\n"
    )


def test_strict_stats_names_the_line_and_position(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"text": "<Parallel><Outlines><Outline>1:A</Outline></Outlines><Thread>1:1</Thread></Parallel>"}
    bad = {"text": "1<Thread>1:2</Thread>"}
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    result = run("stats", str(path), "--strict", check=False)
    assert result.returncode != 0
    assert "line 2: token 1 (<Thread>)" in result.stderr
    lenient = json.loads(run("stats", str(path), "--json").stdout)
    assert lenient["summary"]["well_formed_ratio"] == 0.5


def test_quickstart_says_what_an_sglang_run_needs(tmp_path):
    result = run("quickstart", "--out", str(tmp_path), "--engine", "sglang", check=False)
    assert result.returncode != 0
    assert "--engine sglang needs a running SGLang server for the parallel model: pass --base-url" in result.stderr


def test_quickstart_refuses_bad_settings_and_an_unknown_task_before_it_starts(tmp_path):
    out = tmp_path / "run"
    cases = {
        ("--concurrency", "0"): "--concurrency must be a whole number of at least 1, not 0",
        ("--problems", "-3"): "--problems must be a whole number of at least 0, not -3",
        ("--retrain", "--retrain-steps", "0"): "--retrain-steps must be a whole number of at least 1, not 0",
        ("--task", "tw_synt"): "--task tw_synt: lm-eval knows no such task (did you mean tw_synth?)",
        ("--base-url", "localhost:8000"): "--base-url must be an http:// or https:// URL, not 'localhost:8000'",
        ("--baseline-url", "x"): "--baseline-url must be an http:// or https:// URL, not 'x'",
        ("--baseline", "my/baseline"): "--baseline/--baseline-url go with --model or --base-url: the embedded "
        "pair brings its own baseline",
        ("--retrain", "--base-url", "http://x:1"): "--retrain trains the embedded pair anew: it goes with no "
        "--model/--base-url/--baseline",
        ("--max-model-len", "0"): "--max-model-len must be a whole number of at least 1, not 0",
        ("--retrain-steps", "5"): "--retrain-steps goes with --retrain or --pretrained: the embedded models train no "
        "steps",  # once ignored without a word
    }
    for flags, message in cases.items():
        done = run("quickstart", "--out", str(out), *flags, check=False)
        assert done.returncode == 1 and done.stderr == f"threadweaver quickstart: {message}\n", (flags, done.stderr)
    assert not out.exists()


def test_quickstart_refuses_a_kv_cache_size_vllm_cannot_read_before_it_trains(tmp_path, monkeypatch):
    """It once trained for up to half an hour before vLLM's int() failed on it in the server."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "junk")
    done = run("quickstart", "--out", str(tmp_path / "run"), "--retrain", check=False)
    assert done.returncode == 1 and done.stderr == (
        "threadweaver quickstart: VLLM_CPU_KVCACHE_SPACE is 'junk': vLLM reads it as a whole number of GiB; unset it "
        "or set one\n"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("other", [["--retrain"], ["--model", "some/model"]])
def test_quickstart_pgrpo_rows_refuse_other_models(tmp_path, other):
    result = run("quickstart", "--out", str(tmp_path), "--pgrpo", *other, check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--pgrpo compares the embedded models" in result.stderr
    assert not (tmp_path / "train").exists()  # refused before any training


ENGLISH = (
    "Two checks.<Parallel><Outlines><Outline>1: the first</Outline><Outline>2: the second</Outline></Outlines>"
    '<Thread>1: "a" is fine</Thread><Thread>2: so is "b"</Thread></Parallel> Both hold.'
)


def english_rows(path, **recorded):
    messages = [{"role": "user", "content": "Check both."}, {"role": "assistant", "content": ENGLISH}]
    row = {"id": "e1", "messages": messages}
    path.write_text(json.dumps({**row, **recorded}) + "\n")
    return path


def test_synth_rows_record_the_tokenizer_they_are_written_for(data):
    rows = [json.loads(line) for line in (data / "parallel" / "train.jsonl").read_text().splitlines()]
    assert {row["tokenizer"] for row in rows} == {"synth"}


def test_stats_and_view_read_rows_with_the_tokenizer_the_rows_record(tmp_path):
    """curate and convert write Qwen-tokenised text: the readers need no --tokenizer for it."""
    path = english_rows(tmp_path / "curated.jsonl", tokenizer="qwen")
    stats = json.loads(run("stats", str(path), "--json").stdout)
    assert stats["summary"]["rows"] == 1 and stats["summary"]["well_formed_ratio"] == 1.0
    assert stats["rows"][0]["critical_path_tokens"] < stats["rows"][0]["total_tokens"]
    assert run("view", str(path), "--out", str(tmp_path / "page.html")).returncode == 0


def test_rows_that_record_no_tokenizer_get_a_message_that_names_the_choices(tmp_path):
    path = english_rows(tmp_path / "rows.jsonl")
    for command in ("stats", "view"):
        result = run(command, str(path), check=False)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert "records no 'tokenizer' and was read with 'synth'" in result.stderr
        assert "--tokenizer qwen, a tokenizer directory or hub id" in result.stderr
    assert run("stats", str(path), "--tokenizer", "qwen").returncode == 0


def test_a_row_whose_shape_is_at_fault_gets_no_tokenizer_hint(tmp_path):
    """The hint names other tokenizers; a row that is no JSON object, a field of the wrong type, or a turn
    the chat template cannot render is not the tokenizer's fault."""
    rows, page = tmp_path / "rows.jsonl", tmp_path / "page.html"
    no_content = {"messages": [{"role": "user"}, {"role": "assistant", "content": "4"}]}
    cases = [
        ("[1, 2, 3]", ["stats", str(rows)], "line 1: not a JSON object"),
        (json.dumps({"text": 5}), ["filter", str(rows), str(tmp_path / "kept.jsonl")], "field 'text' must be a string"),
        (
            json.dumps(no_content),
            ["view", str(rows), "--out", str(page)],
            "line 1: field 'messages': the chat template cannot render this conversation",
        ),
        (
            json.dumps({"tokenizer": 5, "text": "a"}),
            ["stats", str(rows)],
            f"{rows}: line 1: field 'tokenizer': must name the tokenizer the row was written with, not 5 "
            "(--tokenizer NAME reads the rows with another)",
        ),
    ]
    for line, args, message in cases:
        rows.write_text(line + "\n")
        done = run(*args, check=False)
        assert done.returncode == 1 and message in done.stderr, (line, done.stderr)
        assert "records no 'tokenizer'" not in done.stderr and "Traceback" not in done.stderr
    assert not page.exists() and not (tmp_path / "kept.jsonl").exists()


def test_two_files_written_with_different_tokenizers_ask_for_one(tmp_path, data):
    path = english_rows(tmp_path / "curated.jsonl", tokenizer="qwen")
    result = run("view", str(path), str(data / "parallel" / "validation.jsonl"), check=False)
    assert result.returncode != 0 and "written with different tokenizers" in result.stderr
    assert "records 'qwen'" in result.stderr and "records 'synth'" in result.stderr


def test_generated_rows_record_the_tokenizer_by_its_directory(tmp_path, monkeypatch):
    from orchestrator_scripts import GOOD, PROMPT

    from threadweaver.batch import trajectory_row
    from threadweaver.format import Format
    from threadweaver.kit.tokenizers import load_tokenizer, qwen_tokenizer
    from threadweaver.orchestrator import Limits, Orchestrator
    from threadweaver.testing import ScriptedEngine

    qwen_tokenizer().save_pretrained(tmp_path / "model")
    monkeypatch.chdir(tmp_path)  # a relative directory is recorded as an absolute one
    fmt = Format.from_tokenizer(load_tokenizer("model"))
    trajectory = asyncio.run(Orchestrator(ScriptedEngine(fmt, GOOD), fmt).run(fmt.encode(PROMPT)))
    row = trajectory_row(trajectory, fmt, 0.0, Limits(), id="r")
    assert row["tokenizer"] == str(tmp_path / "model")
    assert load_tokenizer(row["tokenizer"]).get_vocab() == qwen_tokenizer().get_vocab()


@pytest.mark.parametrize(
    "command",
    [
        ["view", "{rows}", "--out", "{out}"],
        ["filter", "{rows}", "{out}"],
        ["convert", "{rows}", "{out}", "--from", "npr"],
    ],
    ids=["view", "filter", "convert"],
)
def test_an_output_that_would_overwrite_the_input_or_is_a_folder_is_refused_first(tmp_path, data, command):
    rows = tmp_path / "rows.report.json"  # filter's and convert's report path for OUT "rows"
    rows.write_bytes((data / "parallel" / "validation.jsonl").read_bytes())
    before = rows.read_bytes()
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    outs = {
        str(rows): f"{rows} is the input file",
        str(tmp_path / "." / rows.name): "is the input file",
        str(tmp_path / "folder"): f"{tmp_path / 'folder'} is a directory",
        str(tmp_path / "file" / "out.jsonl"): f"{tmp_path / 'file'} is a file, not a folder",
    }
    if command[0] != "view":
        outs[str(tmp_path / "rows")] = f"{rows} is the input file"
    for out, message in outs.items():
        done = run(*(arg.format(rows=rows, out=out) for arg in command), check=False)
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, (out, done.stderr)
        assert rows.read_bytes() == before
    assert os.listdir(tmp_path / "folder") == []


def test_bad_synth_and_kit_settings_are_named_before_anything_is_written(tmp_path):
    (tmp_path / "file").write_text("x")
    synth, kit = ("synth", "--out", str(tmp_path / "s")), ("kit", "--out", str(tmp_path / "k"))
    cases = {
        (*synth, "--train", "-5"): "--train must be 0 or more problems, not -5",
        (*synth, "--digits", "0"): "--digits must be a whole number of at least 1, not 0",
        (*synth, "--max-terms", "9"): "--max-terms must be at most 8, not 9",
        (*synth, "--min-terms", "5"): "--min-terms and --max-terms disagree: 5 is more than 4",
        ("synth", "--out", str(tmp_path / "file")): f"{tmp_path / 'file'} is a file, not a folder",
        ("synth", "--out", str(tmp_path / "file" / "sub")): f"{tmp_path / 'file'} is a file, not a folder",
        (*kit, "--num-attention-heads", "0"): "--num-attention-heads must be a whole number of at least 1, not 0",
        (*kit, "--num-key-value-heads", "3"): "--num-attention-heads and --num-key-value-heads disagree: 4 is not a",
        (*kit, "--hidden-size", "30"): "--hidden-size and --num-attention-heads disagree: 30 is not a multiple of 4",
        ("kit", "--out", str(tmp_path / "file" / "sub"), "--no-model"): f"{tmp_path / 'file'} is a file, not a folder",
    }
    for args, message in cases.items():
        done = run(*args, check=False)
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert sorted(os.listdir(tmp_path)) == ["file"] and (tmp_path / "file").read_text() == "x"


def test_a_file_of_synth_or_kit_that_a_folder_holds_the_place_of_is_refused_before_any_is_written(tmp_path):
    """A rerun into a finished output: where one of its files cannot be written, none is rewritten."""
    synth, kit = tmp_path / "synth", tmp_path / "kit"
    run("synth", "--out", str(synth), "--train", "5", "--validation", "2")
    run("kit", "--out", str(kit), "--hidden-size", "32")
    for out, blocked, rerun in [
        (synth, "sequential/validation.jsonl", ["synth", "--out", str(synth), "--train", "3", "--validation", "1"]),
        (kit, "model.safetensors", ["kit", "--out", str(kit), "--hidden-size", "64"]),
    ]:
        (out / blocked).unlink()
        (out / blocked).mkdir()
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        done = run(*rerun, check=False)
        assert done.returncode == 1 and f"{out / blocked} is a directory; move it" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_synth_into_a_folder_of_another_dataset_is_refused_and_the_same_recipe_is_taken(tmp_path):
    """``synth --out`` replaced a folder's splits without a word; a rerun of the same recipe writes the same rows."""
    out = tmp_path / "s"
    run("synth", "--out", str(out), "--train", "5", "--validation", "2")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert run("synth", "--out", str(out), "--train", "5", "--validation", "2").returncode == 0
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    done = run("synth", "--out", str(out), "--train", "3", "--validation", "2", "--digits", "2", check=False)
    assert done.returncode == 1 and done.stderr == (
        f"threadweaver synth: {out} holds a dataset of another recipe (--train 5, --digits 3, says its recipe.json), "
        f"which this run would replace: give another --out, or remove {out} first\n"
    )
    (out / "recipe.json").unlink()
    done = run("synth", "--out", str(out), "--train", "5", "--validation", "2", check=False)
    assert done.returncode == 1 and "which this run would replace, and no synth recipe.json says" in done.stderr
    del before[out / "recipe.json"]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_kit_leaves_a_trained_model_in_its_out_as_it_was(tmp_path):
    """``kit --out`` on a trained model's folder replaced its weights with random ones, exit 0; the same kit
    written again is taken, by another transformers too."""
    kit = tmp_path / "kit"
    run("kit", "--out", str(kit), "--hidden-size", "32")
    run("kit", "--out", str(kit), "--hidden-size", "32")  # again, the same files
    for name in ("config.json", "generation_config.json"):  # as an older transformers wrote them
        config = json.loads((kit / name).read_text())
        (kit / name).write_text(json.dumps({**config, "transformers_version": "5.16.1"}))
    run("kit", "--out", str(kit), "--hidden-size", "32")
    assert json.loads((kit / "config.json").read_text())["transformers_version"] != "5.16.1"
    (kit / "model.safetensors").write_bytes(b"trained weights")
    done = run("kit", "--out", str(kit), "--hidden-size", "32", check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{kit} already holds model.safetensors unlike this kit's: writing it would replace" in done.stderr
    assert (kit / "model.safetensors").read_bytes() == b"trained weights"


EMBEDDED = os.path.join(os.path.dirname(__file__), "..", "apps", "quickstart", "models", "parallel")


def in_process_problems(path, count: int) -> list[str]:
    """``generate`` arguments: ``count`` problems written to ``path``, decoded in-process by an embedded model."""
    path.write_text(
        "".join(json.dumps({"id": str(i), "prompt": f"{i}+1=", "answer": i + 1}) + "\n" for i in range(count))
    )
    return [str(path), str(path.with_name("out.jsonl")), "--engine", "transformers", "--model", EMBEDDED]


@pytest.mark.parametrize("limit, reason", [(["--max-tokens", "4"], "length"), (["--timeout-s", "0.1"], "timeout")])
def test_generate_counts_the_trajectories_a_limit_cut_short(tmp_path, limit, reason):
    """A trajectory that times out leaves its batch decoding in a worker thread: the engine lets it go quietly."""
    result = run("generate", *in_process_problems(tmp_path / "problems.jsonl", 2), *limit)
    out = tmp_path / "out.jsonl"
    assert f"decoded 2 trajectories into {out}, 2 cut short (finish_reason {reason} 2): " in result.stdout
    assert f"to grade them by the problems' answers (pass@1): threadweaver filter {out} KEPT.jsonl" in result.stdout
    assert [json.loads(line)["finish_reason"] for line in out.read_text().splitlines()] == [reason] * 2
    assert "Task was destroyed" not in result.stderr


def test_generate_stopped_by_ctrl_c_says_where_its_trajectories_are_and_resumes(tmp_path):
    argv = [CLI, "generate", *in_process_problems(tmp_path / "problems.jsonl", 40), "--concurrency", "2"]
    out = tmp_path / "out.jsonl"
    status, err = interrupted_once_written(argv, str(out))
    assert status == 130 and "Traceback" not in err and "Task was destroyed" not in err, err[-2000:]
    assert err.endswith(
        f"threadweaver generate: stopped\nfinished trajectories are in {out}; rerun the same command to resume\n"
    )
    finished = out.read_text().count("\n")
    assert 0 < finished < 40
    resumed = subprocess.run([*argv, "--max-tokens", "4"], capture_output=True, text=True, check=True)
    assert f"resuming: {finished} trajectories already in {out}, {40 - finished} to go" in resumed.stderr


def test_generate_resumes_only_with_the_sampling_its_rows_were_made_with(tmp_path):
    """A rerun with ``--n 4`` and no ``--temperature`` appended greedy samples to ones drawn at 0.6, without a word."""
    argv = [*in_process_problems(tmp_path / "problems.jsonl", 2), "--max-tokens", "4"]
    sampled = ["--temperature", "0.6", "--seed", "0"]
    run("generate", *argv, *sampled)
    out = tmp_path / "out.jsonl"
    before = out.read_text()
    assert {json.dumps(json.loads(line)["sampling"]) for line in before.splitlines()} == {
        json.dumps({"temperature": 0.6, "top_p": 1.0, "top_k": -1, "seed": 0})
    }
    done = run("generate", *argv, "--n", "2", check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.endswith(
        f"{out}: its rows were sampled with --temperature 0.6, --seed 0, and this run's --temperature 0.0, "
        "no --seed: resuming would mix the two in one file; give the same flags to go on, or name a new OUT\n"
    )
    assert out.read_text() == before
    resumed = run("generate", *argv, *sampled, "--n", "2")
    assert f"resuming: 2 trajectories already in {out}, 2 to go" in resumed.stderr


def test_an_unknown_flag_gets_the_commands_own_usage():
    done = run("stats", "--bogus", "rows.jsonl", check=False)
    assert done.returncode == 2 and "usage: threadweaver stats" in done.stderr
    assert "threadweaver stats: error: unrecognized arguments: --bogus" in done.stderr
    abbreviated = run("stats", "--summary", "rows.jsonl", check=False)  # not taken for --summary-only
    assert "threadweaver stats: error: unrecognized arguments: --summary" in abbreviated.stderr


def test_filter_of_an_empty_file_leaves_its_output_as_it_was(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    kept, report = tmp_path / "kept.jsonl", tmp_path / "kept.jsonl.report.json"
    kept.write_text("finished work\n")
    report.write_text("{}")  # an earlier run's output, with its report
    done = run("filter", str(tmp_path / "empty.jsonl"), str(kept), check=False)
    assert done.returncode == 1 and "empty.jsonl: no rows to filter; " in done.stderr and "Traceback" not in done.stderr
    assert kept.read_text() == "finished work\n" and report.read_text() == "{}"


@pytest.mark.parametrize("command", [["filter"], ["convert", "--from", "reference", "--text-field", "text"]])
def test_rows_that_are_no_earlier_output_of_the_command_are_not_written_over(tmp_path, command):
    """``filter kept.jsonl generated.jsonl`` (its arguments swapped) replaced the samples with the few it kept."""
    rows, other = tmp_path / "rows.jsonl", tmp_path / "generated.jsonl"
    rows.write_text(json.dumps({"id": "a", "text": "x"}) + "\n")
    other.write_text("the samples of an hour\n")
    done = run(command[0], str(rows), str(other), *command[1:], check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == (
        f"threadweaver {command[0]}: {other} exists without the report that filter and convert write beside their "
        f"output ({other}.report.json): writing would replace rows that are no earlier run's of theirs (or of a run "
        "stopped before its report); name a new file, or remove it first\n"
    )
    assert other.read_text() == "the samples of an hour\n" and sorted(os.listdir(tmp_path)) == [other.name, rows.name]


def test_stats_of_a_file_with_no_rows_says_so_and_fails(tmp_path):
    """An empty file is most often a run that wrote nothing: a summary of nothing with rc 0 would hide it."""
    (tmp_path / "blank.jsonl").write_text("\n\n")
    for flags in ([], ["--json"]):
        done = run("stats", str(tmp_path / "blank.jsonl"), *flags, check=False)
        assert (done.returncode, done.stdout) == (1, "") and done.stderr.endswith("blank.jsonl: no rows to count\n")


def test_unreadable_tokenizers_and_json_nested_too_deep_are_named(tmp_path, data):
    (tmp_path / "tokenizer.json").write_text("{}")
    done = run(
        "stats",
        str(data / "parallel" / "validation.jsonl"),
        "--tokenizer",
        str(tmp_path / "tokenizer.json"),
        check=False,
    )
    assert "is not a tokenizer.json that tokenizers can read" in done.stderr and "Traceback" not in done.stderr
    deep = tmp_path / "deep.jsonl"
    first = (data / "parallel" / "validation.jsonl").read_text().splitlines()[0]
    deep.write_text(first + '\n{"x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    done = run("stats", str(deep), check=False)
    assert "line 2: JSON nested too deep to read" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["sigterm", "sighup"])
def test_a_data_command_stopped_by_a_signal_cleans_up_as_after_ctrl_c(tmp_path, signum):
    """A job scheduler's SIGTERM, a closed terminal's SIGHUP: ``convert`` stops as after Ctrl-C, removing the
    output it had begun and keeping the finished one (it used to die at once and leave ``OUT.tmp``)."""
    from test_convert import mv_row

    rows = tmp_path / "multiverse.jsonl"
    rows.write_text((json.dumps(mv_row()) + "\n") * 40_000)
    out = tmp_path / "out.jsonl"
    out.write_text("finished work\n")
    (tmp_path / "out.jsonl.report.json").write_text("{}")  # an earlier run's output, with its report
    as_a_terminal = {"preexec_fn": lambda: signal.signal(signum, signal.SIG_DFL)}  # nohup'd CI ignores SIGHUP
    process = subprocess.Popen(
        [CLI, "convert", str(rows), str(out), "--from", "multiverse"],
        stderr=subprocess.PIPE,
        text=True,
        **as_a_terminal,
    )
    deadline = time.monotonic() + 60
    while not os.path.exists(str(out) + ".tmp") and process.poll() is None:
        assert time.monotonic() < deadline, "convert did not begin its output in 60 s"
        time.sleep(0.05)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum and "Traceback" not in err, err[-2000:]
    assert err.endswith("threadweaver convert: stopped\n")
    assert not os.path.exists(str(out) + ".tmp") and out.read_text() == "finished work\n"


@pytest.mark.parametrize("command", [["filter", "OUT"], ["convert", "OUT", "--from", "npr"], ["stats"]])
def test_a_folder_or_nothing_for_rows_is_one_line(tmp_path, command):
    """stats said Python's "[Errno 21] Is a directory: ..." """
    name, *flags = command
    flags = [str(tmp_path / "out.jsonl") if flag == "OUT" else flag for flag in flags]
    for given, why in ((tmp_path, "a folder, not a file of rows"), (tmp_path / "nope.jsonl", "no such file")):
        done = run(name, str(given), *flags, check=False)
        assert done.returncode == 1 and done.stderr == f"threadweaver {name}: {given}: {why}\n", done.stderr


def test_view_of_more_than_two_files_is_a_usage_error(data):
    rows = str(data / "parallel" / "validation.jsonl")
    done = run("view", rows, rows, rows, "--out", "v.html", check=False)
    assert done.returncode == 2 and "usage: threadweaver view" in done.stderr, done.stderr
    assert done.stderr.endswith("threadweaver view: error: one file, or two side by side\n")
    assert " FILE [FILE2]\n" in run("view", "--help").stdout


@pytest.mark.parametrize(
    "command, shown",
    [
        ("kit", "--model, --no-model also save a tiny model (default: True)"),
        ("filter", "Keep correct trajectories with no parallel block too. (default: False)"),
        ("generate", "sequential baseline. (default: True) --concurrent-threads"),
    ],
)
def test_on_off_flags_show_their_default_in_help(command, shown):
    assert shown in " ".join(run(command, "--help").stdout.split())


NO_FOLDER = "/proc/tw-no-folder"
"""A folder no one can make, root included (``os.access`` says yes to root anywhere)."""
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")


@needs_proc
def test_synth_into_a_folder_that_cannot_be_made_or_an_empty_out_is_one_line(tmp_path):
    """/proc/x was a FileNotFoundError traceback; "" wrote into the current directory."""
    cases = {
        NO_FOLDER: "threadweaver synth: cannot write a file in /proc (",
        "": "threadweaver synth: --out must name a folder to write into, not ''\n",
    }
    for out, message in cases.items():
        done = subprocess.run([CLI, "synth", "--out", out], capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 1 and done.stderr.startswith(message), (out, done.stderr)
        assert done.stderr.count("\n") == 1
    assert os.listdir(tmp_path) == []


@needs_proc
def test_quickstart_refuses_an_out_it_cannot_write_into_before_anything_starts(tmp_path):
    """A file was a FileExistsError traceback, a folder under one or under /proc a traceback too."""
    (tmp_path / "afile").write_text("x")
    afile = tmp_path / "afile"
    cases = {
        str(afile): f"cannot write into {afile}: {afile} is a file, not a folder\n",
        str(afile / "sub"): f"cannot write into {afile / 'sub'}: {afile} is a file, not a folder\n",
        NO_FOLDER: "cannot write a file in /proc (",
        "": "--out must name a folder to write into, not ''\n",
    }
    for out, message in cases.items():
        done = subprocess.run([CLI, "quickstart", "--out", out], capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 1 and done.stderr.startswith(f"threadweaver quickstart: {message}"), done.stderr
        assert done.stderr.count("\n") == 1
    assert os.listdir(tmp_path) == ["afile"] and afile.read_text() == "x"


def test_pgrpo_an_output_dir_that_cannot_be_made_is_one_line(tmp_path, monkeypatch, capsys):
    """TRL's trainer makes --output-dir once the model has loaded: under a file (or under /proc) that was a
    NotADirectoryError (FileNotFoundError) traceback. The run is stood in for (it loads TRL, then a model) by
    one that makes --output-dir as the trainer does."""
    import sys
    import types

    from threadweaver.cli import main

    (tmp_path / "afile").write_text("x")
    output_dir = str(tmp_path / "afile" / "sub")
    command = types.SimpleNamespace(main=lambda argv: os.makedirs(argv[-1], exist_ok=True))
    monkeypatch.setitem(sys.modules, "threadweaver.trl_pgrpo", types.SimpleNamespace(command=command))
    with pytest.raises(SystemExit) as exit_:
        main(["pgrpo", "MODEL", "problems.jsonl", "--output-dir", output_dir])
    assert exit_.value.code == f"threadweaver pgrpo: {output_dir}: Not a directory"
    assert (tmp_path / "afile").read_text() == "x"
