"""The tw_* tasks and the ``threadweaver`` model through the real lm-eval 0.4.13.

The plain ``lm_eval`` CLI finds both through the start-up hook that ``scripts/setup.sh``
installs (``python -m threadweaver.lmeval_tasks install``); every run here passes no
``--include_path``. Data are local files in each benchmark's own schema.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lm_eval_cli import LM_EVAL, lm_eval_run
from trained_model import run_cli
from vllm_server import SMALL
from wheel_venv import wheel_venv

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data" / "lmeval"
BENCHMARKS = ["tw_aime24", "tw_aime25", "tw_amc23", "tw_math500", "tw_minerva", "tw_olympiadbench"]
METRICS = ["acc", "token_latency", "total_tokens", "speedup", "parallel_activation", "well_formed", "stats_measured"]
GOLD = {
    "tw_aime24": ["1", "16", "1456"],
    "tw_aime25": ["20", "986", "330"],
    "tw_amc23": ["90", "1", "58"],
    "tw_math500": [r"\left( 3, \frac{\pi}{2} \right)", "(2,3)", "2"],
    "tw_minerva": ["3.8e33", "3", "4"],
    "tw_olympiadbench": ["-1,3", "10", r"\frac{n}{n+1}"],
}
RIGHT = {  # a differently written right answer for each row
    "tw_aime24": ["001", "16", "1,456"],
    "tw_aime25": ["20", "986.0", "330"],
    "tw_amc23": ["90", r"\frac{6}{6}", "58"],
    "tw_math500": [r"(3, \tfrac{\pi}{2})", r"(2, 3)", r"\dfrac{4}{2}"],
    "tw_minerva": [r"3.8 \times 10^{33}", "3.0", "4"],
    "tw_olympiadbench": ["3, -1", "10", r"\dfrac{n}{n+1}"],
}


def test_task_manager_and_model_registry_find_threadweaver():
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    from threadweaver.lmeval_tasks.model import ThreadWeaverLM

    tasks = set(TaskManager(include_defaults=False).all_tasks)
    assert {*BENCHMARKS, "tw_synth", "tw_shopping", "tw_math"} <= tasks
    assert get_model("threadweaver") is ThreadWeaverLM
    assert get_model("local-completions").__name__ == "LocalCompletionsAPI"  # lm-eval's own models are kept


def test_readme_lists_exactly_the_model_args_an_unknown_key_error_names():
    from threadweaver.lmeval_tasks.model import split_model_args

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    bullet = readme.split("- **Model arguments**", 1)[1].split("An unknown key", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", bullet)) - {"vllm", "sglang", "transformers", "wall_s"}
    with pytest.raises(ValueError) as unknown:
        split_model_args({"no_such_key": 1})
    known = set(unknown.value.args[0].split("known: ", 1)[1].split(" (", 1)[0].split(", ")) | {"pretrained"}
    assert named == known


def test_hook_can_be_switched_off_and_include_path_works_instead():
    code = (
        "import sys; from lm_eval.tasks import TaskManager; "
        "tm = TaskManager(include_defaults=False, include_path=sys.argv[1:] or None); "
        "print('tw_aime24' in tm.all_tasks)"
    )
    env = {**os.environ, "THREADWEAVER_LMEVAL_AUTOLOAD": "0"}
    path = subprocess.run(
        [sys.executable, "-m", "threadweaver.lmeval_tasks", "path"], check=True, capture_output=True, text=True
    ).stdout.strip()

    def finds(*include):
        done = subprocess.run(
            [sys.executable, "-c", code, *include], env=env, check=True, capture_output=True, text=True
        )
        return done.stdout.strip() == "True"

    assert not finds()
    assert finds(path)


@pytest.fixture(scope="module")
def qwen_kit(tmp_path_factory):
    """A tiny random Qwen3 with the real Qwen tokenizer (and the tags)."""
    out = tmp_path_factory.mktemp("kit") / "qwen"
    run_cli("kit", "--out", str(out), "--tokenizer", "qwen", *SMALL)
    return out


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_benchmark_task_reads_its_schema_prompts_and_grades(benchmark, qwen_kit, monkeypatch):
    """Config, local rows, prompt and grading of each task, through lm-eval's own task objects."""
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("THREADWEAVER_TOKENIZER", str(qwen_kit))
    task = TaskManager(include_defaults=False, metadata={"data_dir": str(DATA)}).load([benchmark])["tasks"][benchmark]
    docs = list(task.test_docs())
    assert [doc["gold"] for doc in docs] == GOLD[benchmark]
    for doc, right in zip(docs, RIGHT[benchmark]):
        prompt = task.doc_to_text(doc)
        assert prompt.endswith("Please reason step by step, and put your final answer within \\boxed{}.")
        problem = doc.get("Problem") or doc.get("problem") or doc["question"]
        assert prompt.startswith(problem)
        metrics = task.process_results(doc, [[f"<think>\nwork</think>\n\\boxed{{{right}}}", "\\boxed{999999}"]])
        assert metrics["acc"] == 0.5, (doc["gold"], right)
        assert metrics["stats_measured"] == 0.0 and metrics["speedup"] == 1.0 and metrics["well_formed"] == 1.0
    if benchmark == "tw_olympiadbench":
        assert "more than one answer" in task.doc_to_text(docs[0])
        assert "more than one answer" not in task.doc_to_text(docs[1])


def test_another_k_is_a_task_that_includes_ours(tmp_path):
    """avg@16 as the README says: a three-line task of the user's own, beside their tasks."""
    from lm_eval.tasks import TaskManager

    from threadweaver.lmeval_tasks.discovery import TASKS_DIR

    (tmp_path / "mine.yaml").write_text(f"include: {TASKS_DIR}/tw_aime24.yaml\ntask: my_aime24_avg16\nrepeats: 16\n")
    manager = TaskManager(include_defaults=False, include_path=str(tmp_path), metadata={"data_dir": str(DATA)})
    task = manager.load(["my_aime24_avg16"])["tasks"]["my_aime24_avg16"]
    assert task.config.repeats == 16 and len(list(task.test_docs())) == 3


def test_a_local_file_in_the_wrong_schema_names_the_missing_field(tmp_path):
    from lm_eval.tasks import TaskManager

    wrong = tmp_path / "aime.jsonl"
    wrong.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"aime.jsonl: no field 'Problem', 'Answer' \(the rows have problem, answer\)"):
        TaskManager(include_defaults=False, metadata={"tw_aime24_file": str(wrong)}).load(["tw_aime24"])


def test_tw_math_group_runs_all_six_through_the_cli(qwen_kit, tmp_path):
    """The whole group, offline, in-process (the transformers engine on a random tiny Qwen3)."""
    results = lm_eval_run(
        tmp_path / "out",
        "--model",
        "threadweaver",
        "--model_args",
        f"engine=transformers,model={qwen_kit}",
        "--tasks",
        "tw_math",
        "--limit",
        "1",
        "--gen_kwargs",
        "max_gen_toks=4",
        env={"THREADWEAVER_DATA_DIR": str(DATA)},
    )
    for name in [*BENCHMARKS, "tw_math"]:
        assert {f"{m},avg" for m in METRICS} <= set(results["results"][name]), name
    for name in BENCHMARKS:
        [sample] = results["samples"][name]
        repeats = 8 if name in ("tw_aime24", "tw_aime25", "tw_amc23") else 1
        assert len(sample["resps"][0]) == repeats
        assert sample["total_tokens"] <= 4 and sample["stats_measured"] == 1.0
        prompt = sample["arguments"]["gen_args_0"]["arg_0"]
        assert prompt.endswith("\\boxed{}.") and sample["doc"]["gold"] == GOLD[name][0]


def test_without_the_hook_the_cli_runs_through_the_packages_own_entry(qwen_kit, tmp_path):
    """THREADWEAVER_LMEVAL_AUTOLOAD=0: the plain CLI has no threadweaver model; ``python -m
    threadweaver.lmeval_tasks lm_eval`` is lm-eval's CLI with the model and the tasks, no --include_path."""
    args = ["--model", "threadweaver", "--model_args", f"engine=transformers,model={qwen_kit}", "--tasks"]
    args += ["tw_math500", "--limit", "1", "--gen_kwargs", "max_gen_toks=4"]
    env = {"THREADWEAVER_DATA_DIR": str(DATA), "THREADWEAVER_LMEVAL_AUTOLOAD": "0"}
    with pytest.raises(AssertionError, match="Tasks not found: tw_math500"):
        lm_eval_run(tmp_path / "plain", *args, env=env)
    results = lm_eval_run(
        tmp_path / "out", *args, env=env, cli=(sys.executable, "-m", "threadweaver.lmeval_tasks", "lm_eval")
    )
    assert results["samples"]["tw_math500"][0]["doc"]["gold"] == GOLD["tw_math500"][0]


def test_the_cli_says_a_threadweaver_error_in_one_line_and_a_script_keeps_its_traceback(qwen_kit, tmp_path):
    """lm-eval's CLI prints what a model or a task's loader raises as a traceback. threadweaver's errors (a bad
    model arg, a data folder without the task's file) are one line there; a script that calls lm-eval keeps
    Python's traceback."""
    model_args = f"engine=transformers,model={qwen_kit}"
    cases = [  # --model_args, THREADWEAVER_DATA_DIR, the error
        (f"{model_args},branching=maybe", DATA, "model_args branching must be true or false (or 1 or 0), not 'maybe'"),
        (model_args, tmp_path, f"{tmp_path} has no tw_math500.jsonl/.json/.parquet/.csv"),
        # transformers' traceback, hub advice included, before the model folder was named first
        (f"engine=transformers,model={tmp_path / 'no'}", DATA, f"{tmp_path / 'no'}: no such directory (a hub id"),
    ]
    for args, data, error in cases:
        command = [LM_EVAL, "run", "--model", "threadweaver", "--model_args", args, "--tasks", "tw_math500"]
        env = {**os.environ, "THREADWEAVER_DATA_DIR": str(data)}
        done = subprocess.run([*command, "--limit", "1"], capture_output=True, text=True, env=env, timeout=600)
        said = done.stderr.splitlines()[-1]
        assert done.returncode == 1 and said.startswith(f"threadweaver: {error}"), done.stderr[-3000:]
        assert "Traceback" not in done.stderr
    script = "import lm_eval, sys; lm_eval.simple_evaluate('threadweaver', sys.argv[1], tasks=sys.argv[2:])"
    command = [sys.executable, "-c", script, cases[0][0], "tw_math500"]
    env = {**os.environ, "THREADWEAVER_DATA_DIR": str(DATA)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 1 and "Traceback" in done.stderr
    assert done.stderr.splitlines()[-1] == f"ValueError: {cases[0][2]}"


def test_ctrl_c_says_where_the_trajectories_are_and_how_to_go_on(qwen_kit, tmp_path):
    """lm-eval's CLI said only ``threadweaver: stopped``; a plain rerun decodes every trajectory again."""
    from threadweaver.testing import interrupted_once_written

    trajectories = tmp_path / "t.jsonl"
    model_args = f"engine=transformers,model={qwen_kit},trajectories={trajectories}"
    command = [LM_EVAL, "run", "--model", "threadweaver", "--model_args", model_args, "--tasks", "tw_synth"]
    command += ["--limit", "40", "--gen_kwargs", "max_gen_toks=64", "--output_path", str(tmp_path / "out")]
    status, err = interrupted_once_written(command, str(trajectories), wait_s=300)
    assert status == 130 and "Traceback" not in err, err[-3000:]
    assert err.splitlines()[-1] == (
        f"threadweaver: stopped; the trajectories it finished are in {trajectories}: rerun with resume=true added "
        "to model_args to go on (without it, a rerun decodes them again)"
    )


def test_a_rerun_with_resume_decodes_only_what_the_trajectories_file_lacks(qwen_kit, tmp_path):
    """tw_math500 samples, so lm-eval's --use_cache would decode it all again; ``resume=true`` takes what
    the first run wrote (a torn last line, as a crash leaves, is decoded again), with the model's folder
    named another way (it was matched as a string: all was decoded again)."""
    trajectories = tmp_path / "t.jsonl"
    model_args = f"engine=transformers,model={qwen_kit},trajectories={trajectories},resume=true"
    args = ["--model", "threadweaver", "--model_args", model_args, "--tasks", "tw_math500"]
    args += ["--gen_kwargs", "max_gen_toks=4"]
    env = {"THREADWEAVER_DATA_DIR": str(DATA)}
    first = lm_eval_run(tmp_path / "first", *args, "--limit", "1", env=env)
    [row] = [json.loads(line) for line in trajectories.read_text().splitlines()]
    with trajectories.open("a") as f:
        f.write('{"id": "tw_math500/1", "sam')  # torn
    again = [*args[:3], model_args.replace(f"model={qwen_kit}", f"model={qwen_kit}/"), *args[4:]]  # the same folder
    second = lm_eval_run(tmp_path / "second", *again, "--limit", "2", env=env)
    rows = [json.loads(line) for line in trajectories.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["tw_math500/0", "tw_math500/1"] and rows[0] == row  # only the new one
    was, now = first["samples"]["tw_math500"][0], second["samples"]["tw_math500"][0]
    assert now["resps"] == was["resps"] and now["total_tokens"] == was["total_tokens"] == row["stats"]["total_tokens"]
    assert now["stats_measured"] == 1.0 and row["gen_kwargs"]["max_gen_toks"] == 4
    assert row["decoded_with"]["limits"]["max_request_tokens"] == 4  # the cap in force, as files have always said
    # another seed (or model, or limits) decodes anew: its trajectories are not the file's
    args[3] = model_args + ",seed=1"
    lm_eval_run(tmp_path / "third", *args, "--limit", "2", env=env)
    assert len(trajectories.read_text().splitlines()) == 4


@pytest.fixture(scope="module")
def synth_problems(trained, tmp_path_factory):
    rows = (trained[0] / "data" / "parallel" / "validation.jsonl").read_text().splitlines()[:6]
    path = tmp_path_factory.mktemp("synth") / "problems.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def synth_runs(trained_server, synth_problems, tmp_path_factory):
    """tw_synth through the CLI, parallel and sequential, against the trained model's vLLM server."""
    env = {"THREADWEAVER_TW_SYNTH_FILE": str(synth_problems)}
    return {
        mode: lm_eval_run(
            tmp_path_factory.mktemp(mode),
            "--model",
            "threadweaver",
            "--model_args",
            f"base_url={trained_server},branching={mode == 'parallel'}",
            "--tasks",
            "tw_synth",
            env=env,
        )
        for mode in ("parallel", "sequential")
    }


def test_tw_synth_token_stats_are_the_orchestrators_own(synth_runs, synth_problems, trained_server, tmp_path):
    results = synth_runs["parallel"]
    assert {f"{m},avg" for m in METRICS} <= set(results["results"]["tw_synth"])
    out = tmp_path / "trajectories.jsonl"
    run_cli(
        "generate",
        str(synth_problems),
        str(out),
        "--base-url",
        trained_server,
        "--max-tokens",
        "1024",
        "--max-request-tokens",
        "1024",
    )
    by_id = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    samples = results["samples"]["tw_synth"]
    assert len(samples) == len(by_id) == 6
    for sample in samples:
        row = by_id[sample["doc"]["id"]]
        assert sample["resps"][0][0] == row["text"].removesuffix("<|im_end|>")
        assert sample["token_latency"] == row["stats"]["critical_path_tokens"]
        assert sample["total_tokens"] == row["stats"]["total_tokens"]
        assert sample["speedup"] == pytest.approx(row["stats"]["speedup"])
        assert sample["parallel_activation"] == float(row["stats"]["blocks"] > 0)
        assert sample["well_formed"] == float(not row["degradations"])
        assert sample["stats_measured"] == 1.0
    assert sum(s["parallel_activation"] for s in samples) >= 5
    mean = results["results"]["tw_synth"]["token_latency,avg"]
    assert mean == pytest.approx(sum(r["stats"]["critical_path_tokens"] for r in by_id.values()) / 6)
    assert results["results"]["tw_synth"]["speedup,avg"] > 1.1


def test_tw_synth_accuracy_is_math_verify_on_the_responses(synth_runs, synth_problems, monkeypatch):
    """Each response's acc is the reward's grade; the small model answers these problems wrong, so a right answer is
    made of a response of its, boxed anew, and scored by lm-eval's own task object (an acc of 0 throughout was no
    check)."""
    from lm_eval.tasks import TaskManager

    from threadweaver.reward import grade

    samples = [*synth_runs["parallel"]["samples"]["tw_synth"], *synth_runs["sequential"]["samples"]["tw_synth"]]
    for sample in samples:
        assert sample["acc"] == float(grade(sample["resps"][0][0], sample["doc"]["answer"]).correct)
    assert len(samples) == 12
    monkeypatch.setenv("THREADWEAVER_TW_SYNTH_FILE", str(synth_problems))
    task = TaskManager(include_defaults=False).load(["tw_synth"])["tasks"]["tw_synth"]
    sample = samples[0]
    response = sample["resps"][0][0]
    kept = response[: response.rindex("\\boxed{")] if "\\boxed{" in response else response  # one cut short has none
    right = kept + f"\\boxed{{{sample['doc']['answer']}}}"
    doc = next(doc for doc in task.test_docs() if doc["id"] == sample["doc"]["id"])
    assert [task.process_results(doc, [[text]])["acc"] for text in (response, right)] == [sample["acc"], 1.0]


def test_sequential_baseline_has_speedup_one(synth_runs):
    summary = synth_runs["sequential"]["results"]["tw_synth"]
    assert summary["speedup,avg"] == 1.0 and summary["parallel_activation,avg"] == 0.0
    for sample in synth_runs["sequential"]["samples"]["tw_synth"]:
        assert sample["token_latency"] == sample["total_tokens"] > 0
        assert sample["stats_measured"] == 1.0


def test_another_backend_is_graded_and_tokenised(trained, trained_server, synth_problems, tmp_path):
    """lm-eval's own local-completions backend: no side channel, so the tasks tokenise and say so."""
    from transformers import AutoTokenizer

    from threadweaver.lmeval_tasks.measured import count_tokens
    from threadweaver.reward import grade

    model = str(trained[1])
    served = json.loads(
        subprocess.run(["curl", "-s", f"{trained_server}/v1/models"], capture_output=True, text=True, check=True).stdout
    )["data"][0]["id"]
    results = lm_eval_run(
        tmp_path / "out",
        "--model",
        "local-completions",
        "--model_args",
        f"model={served},base_url={trained_server}/v1/completions,tokenizer={model}",
        "--apply_chat_template",
        "--tasks",
        "tw_synth",
        "--limit",
        "3",
        env={"THREADWEAVER_TW_SYNTH_FILE": str(synth_problems)},
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    assert results["results"]["tw_synth"]["stats_measured,avg"] == 0.0
    for sample in results["samples"]["tw_synth"]:
        response = sample["resps"][0][0]
        counts = count_tokens(response, tokenizer)[0]
        assert sample["token_latency"] == counts.critical_path_tokens > 0
        assert sample["total_tokens"] == counts.total_tokens
        assert not math.isnan(sample["speedup"])
        assert sample["acc"] == float(grade(response, sample["doc"]["answer"]).correct)


def test_a_wheel_install_carries_the_start_up_hook(tmp_path):
    """What ``pip install threadweaver[lmeval]`` gives a user: the wheel's ``.pth`` at the top of site-packages."""
    python, site = wheel_venv(tmp_path)
    code = (
        "import json, threadweaver; from lm_eval.api.registry import get_model; from lm_eval.tasks import TaskManager; "
        "print(json.dumps([threadweaver.__file__, sorted(t for t in TaskManager(include_defaults=False).all_tasks "
        "if t.startswith('tw_')), get_model('threadweaver').__module__]))"
    )
    where, tasks, module = json.loads(
        subprocess.run([python, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    )
    assert where.startswith(str(site))
    assert tasks == sorted([*BENCHMARKS, "tw_math", "tw_shopping", "tw_synth"])
    assert module == "threadweaver.lmeval_tasks.model"


QUICKSTART = Path(__file__).parents[1] / "apps" / "quickstart" / "models" / "parallel"


def test_equal_responses_keep_their_own_counts_and_a_resumed_run_its_ids(tmp_path):
    """Cut at ``<Parallel>``, every response reads the same: each document still gets its own trajectory's counts.
    A rerun under ``--use_cache`` decodes only the new document, under its own id, and tokenises the cached ones."""
    import lm_eval
    from transformers import AutoTokenizer

    from threadweaver.lmeval_tasks.measured import count_tokens

    out = tmp_path / "trajectories.jsonl"

    def run(limit: int) -> dict:
        samples = lm_eval.simple_evaluate(
            model="threadweaver",
            model_args=f"engine=transformers,model={QUICKSTART},trajectories={out}",
            tasks=["tw_synth"],
            limit=limit,
            gen_kwargs="until=<Parallel>",
            use_cache=str(tmp_path / "cache"),
            log_samples=True,
        )["samples"]["tw_synth"]
        return {sample["doc_id"]: sample for sample in samples}

    first, resumed = run(2), run(3)
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == ["tw_synth/0", "tw_synth/1", "tw_synth/2"]
    assert (
        len({s["resps"][0][0] for s in first.values()}) == 1 < len({r["stats"]["total_tokens"] for r in rows.values()})
    )
    for doc_id, sample in [*first.items(), (2, resumed[2])]:
        stats = rows[f"tw_synth/{doc_id}"]["stats"]
        assert (sample["total_tokens"], sample["token_latency"]) == (
            stats["total_tokens"],
            stats["critical_path_tokens"],
        )
        assert sample["stats_measured"] == 1.0 and sample["cut_short"] == 0.0
    assert resumed[0]["stats_measured"] == resumed[1]["stats_measured"] == 0.0
    tokenizer = AutoTokenizer.from_pretrained(QUICKSTART)
    for row in rows.values():  # counting the text gives what was measured: the end-of-sequence token included
        counted = count_tokens(row["text"].removesuffix(tokenizer.eos_token), tokenizer).stats
        assert (counted.total_tokens, counted.critical_path_tokens) == (
            row["stats"]["total_tokens"],
            row["stats"]["critical_path_tokens"],
        )
