"""The tw_* tasks without decoding: gold answers, local data files (through lm-eval's TaskManager), metrics and counts.

lm-eval itself runs in integration_tests/test_lmeval_tasks.py.
"""

import json
import math
import os
import re

import pytest

from threadweaver.format import Format
from threadweaver.lmeval_tasks import data, discovery, measured, scoring
from threadweaver.orchestrator import DEGRADATION_KINDS
from threadweaver.stats import LatencyStats, latency_stats
from threadweaver.tree import parse_text

PARALLEL = (
    "<think>\nplan<Parallel><Outlines><Outline>1: a</Outline><Outline>2: b</Outline></Outlines>"
    "<Thread>1: one two three</Thread><Thread>2: four</Thread></Parallel>\nsum</think>\n\\boxed{7}"
)


@pytest.fixture(autouse=True)
def fresh_side_channel(monkeypatch):
    monkeypatch.setattr(measured, "_tokenizer", None)
    monkeypatch.setattr(measured, "_tokenizer_hint", None)
    monkeypatch.setattr(measured, "_unloadable", set())
    monkeypatch.delenv(measured.TOKENIZER_ENV, raising=False)


@pytest.mark.parametrize(
    "value,gold",
    [
        (33, "33"),
        (27.0, "27"),
        (2.5, "2.5"),
        (" 986 ", "986"),
        (["$\\frac{1}{2}$"], "\\frac{1}{2}"),
        (["$-1$,$3$"], "-1,3"),
        (["1", "$2$"], "1, 2"),
        ("\\$18.90", "\\$18.90"),
        ("4.5e33", "4.5e33"),
    ],
)
def test_gold_answer_reads_each_benchmarks_answer_field(value, gold):
    assert data.gold_answer(value) == gold


@pytest.mark.parametrize("value", [True, float("nan"), float("inf")])
def test_an_answer_no_response_can_match_is_refused(value):
    with pytest.raises(ValueError, match=f"an answer cannot be {'a boolean' if value is True else value}"):
        data.gold_answer(value)


def test_local_file_order_metadata_then_environment_then_data_dir(tmp_path, monkeypatch):
    named, from_env, folder = tmp_path / "named.jsonl", tmp_path / "env.jsonl", tmp_path / "dir"
    folder.mkdir()
    for path in (named, from_env, folder / "tw_amc23.parquet", folder / "tw_amc23.jsonl"):
        path.write_text("{}\n")
    monkeypatch.setenv("THREADWEAVER_TW_AMC23_FILE", str(from_env))
    assert data.local_file("tw_amc23", {"tw_amc23_file": str(named), "data_dir": str(folder)}) == named
    assert data.local_file("tw_amc23", {"data_dir": str(folder)}) == from_env
    monkeypatch.delenv("THREADWEAVER_TW_AMC23_FILE")
    assert data.local_file("tw_amc23", {"data_dir": str(folder)}) == folder / "tw_amc23.jsonl"
    monkeypatch.setenv(data.DATA_DIR_ENV, str(folder))
    assert data.local_file("tw_amc23", {}) == folder / "tw_amc23.jsonl"
    assert data.local_file("tw_aime24", {}) is None


def test_a_named_local_file_that_is_missing_or_a_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="tw_aime24: the local dataset .*missing.jsonl does not exist"):
        data.local_file("tw_aime24", {"tw_aime24_file": str(tmp_path / "missing.jsonl")})
    with pytest.raises(ValueError, match=f"^tw_aime24: the local dataset {tmp_path} is a folder, not a file$"):
        data.local_file("tw_aime24", {"tw_aime24_file": str(tmp_path)})  # it said "does not exist"


def test_an_olympiadbench_file_without_is_multiple_answer_reads_as_one_answer(tmp_path):
    """The prompt's template read the field, which only the hub's rows have: jinja2's UndefinedError, a traceback."""
    from lm_eval.tasks import TaskManager

    rows = tmp_path / "olympiad.jsonl"
    rows.write_text('{"question": "What is 1+1?", "final_answer": ["2"]}\n')
    metadata = {"tw_olympiadbench_file": str(rows)}
    task = TaskManager(include_defaults=False, metadata=metadata).load(["tw_olympiadbench"])["tasks"][
        "tw_olympiadbench"
    ]
    prompt = task.doc_to_text(next(iter(task.test_docs())))
    assert prompt == "What is 1+1?\n\nPlease reason step by step, and put your final answer within \\boxed{}."


def test_measured_counts_are_used_as_recorded(qwen):
    measured.use_tokenizer(qwen)  # would give other counts: the recorded ones must win
    stats = LatencyStats(
        total_tokens=50,
        critical_path_tokens=20,
        injected_tokens=7,
        thread_tokens=30,
        blocks=1,
        threads_per_block=(2,),
        max_depth=1,
        reference_longest_thread=None,
        reference_total_tokens=57,
    )
    response = measured.Response(PARALLEL, measured.Measured(stats, False, frozenset({"eos_in_thread"}), "length"))
    metrics = scoring.process_results({"gold": "7"}, [[response]])
    assert metrics == {
        "acc": 1.0,
        "token_latency": 20.0,
        "total_tokens": 50.0,
        "speedup": 2.5,
        "parallel_activation": 1.0,
        "well_formed": 0.0,
        "cut_short": 1.0,
        "stats_measured": 1.0,
        **{f"degraded_{kind}": float(kind == "eos_in_thread") for kind in DEGRADATION_KINDS},
    }


def test_equal_texts_keep_their_own_counts_and_a_plain_copy_is_not_measured(qwen):
    """Two timed-out trajectories both answer "": each document still gets its own trajectory's counts."""
    import pickle

    measured.use_tokenizer(qwen)
    short, long = (latency_stats(parse_text(t, Format.from_tokenizer(qwen)).nodes) for t in ("a", PARALLEL))
    first, second = (measured.Response("", measured.Measured(s, True, frozenset(), "timeout")) for s in (short, long))
    assert scoring.process_results({"gold": "7"}, [[first]])["total_tokens"] == short.total_tokens
    assert scoring.process_results({"gold": "7"}, [[second]])["total_tokens"] == long.total_tokens
    cached = pickle.loads(pickle.dumps(second))  # what lm-eval's --use_cache stores
    assert type(cached) is str and scoring.process_results({"gold": "7"}, [[cached]])["stats_measured"] == 0.0


def test_the_task_template_declares_every_metric_the_tasks_return():
    template = (discovery.TASKS_DIR / "_tw_template").read_text()
    declared = re.findall(r"- metric: (\w+)\n\s+aggregation: mean\n\s+higher_is_better: (true|false)", template)
    assert dict(declared) == {name: str(higher).lower() for name, higher in scoring.HIGHER_IS_BETTER.items()}


def test_unmeasured_responses_are_tokenised_and_say_so(qwen):
    measured.use_tokenizer(qwen)
    stats = latency_stats(parse_text(PARALLEL, Format.from_tokenizer(qwen)).nodes)
    sequential = "<think>\nno blocks</think>\n\\boxed{8}"
    metrics = scoring.process_results({"gold": "7"}, [[PARALLEL, sequential]])
    n = len(qwen.encode(sequential, add_special_tokens=False)) + 1  # and the end-of-sequence token, as measured
    critical, total = stats.critical_path_tokens + 1, stats.total_tokens + 1
    assert metrics["stats_measured"] == 0.0
    assert metrics["acc"] == 0.5
    assert metrics["token_latency"] == (critical + n) / 2
    assert metrics["total_tokens"] == (total + n) / 2
    assert metrics["speedup"] == pytest.approx((total / critical + 1.0) / 2)
    assert metrics["parallel_activation"] == 0.5 and metrics["well_formed"] == 1.0
    assert math.isnan(metrics["cut_short"])  # a tokenised response does not say how it ended


def test_a_malformed_response_counts_as_sequential_and_invalid(qwen):
    measured.use_tokenizer(qwen)
    broken = "<think>\n<Parallel><Outlines><Outline>1: a</Outline></Outlines><Thread>1: x</Parallel>\\boxed{7}"
    metrics = scoring.process_results({"gold": "7"}, [broken])
    assert metrics["well_formed"] == 0.0 and metrics["acc"] == 1.0


def test_without_any_tokenizer_token_metrics_are_nan_and_accuracy_still_counts():
    with pytest.warns(RuntimeWarning, match="THREADWEAVER_TOKENIZER"):
        metrics = scoring.process_results({"gold": "7"}, ["\\boxed{7}"])
    assert metrics["acc"] == 1.0 and metrics["stats_measured"] == 0.0
    assert all(math.isnan(metrics[m]) for m in ("token_latency", "total_tokens", "speedup", "well_formed"))


def test_a_tokenizer_that_cannot_load_leaves_the_token_metrics_nan_not_the_run_failed(monkeypatch, tmp_path):
    """It loads at the first response scored, after every response was generated: a traceback lost them all."""
    monkeypatch.setenv(measured.TOKENIZER_ENV, str(tmp_path / "nope"))
    with pytest.warns(RuntimeWarning, match=f"cannot load the tokenizer '{re.escape(str(tmp_path / 'nope'))}'"):
        first = scoring.process_results({"gold": "7"}, ["\\boxed{7}"])
    second = scoring.process_results({"gold": "7"}, ["\\boxed{8}"])  # tried once
    assert (first["acc"], second["acc"]) == (1.0, 0.0) and math.isnan(first["total_tokens"])
    assert math.isnan(second["total_tokens"]) and str(tmp_path / "nope") in measured._unloadable


def test_tokenizer_named_by_the_environment_wins_over_the_metadata_hint(monkeypatch, tmp_path, qwen):
    qwen.save_pretrained(tmp_path / "tok")
    measured.hint_tokenizer("no/such-tokenizer")
    monkeypatch.setenv(measured.TOKENIZER_ENV, str(tmp_path / "tok"))
    assert measured.fallback_tokenizer().encode("A=1") == qwen.encode("A=1")


def test_keep_all_keeps_every_repeat():
    assert scoring.keep_all([["a", "b"], ["c", "d"]], docs=None) == [["a", "b"], ["c", "d"]]


def test_tasks_dir_goes_first_once():
    ours = str(discovery.TASKS_DIR)
    assert discovery.with_tasks_dir(None) == [ours]
    assert discovery.with_tasks_dir("mine") == [ours, "mine"]
    assert discovery.with_tasks_dir(["a", "b"]) == [ours, "a", "b"]
    assert discovery.with_tasks_dir([ours, "a"]) == [ours, "a"]


@pytest.mark.parametrize("task, flags", [("tw_synth", []), ("tw_shopping", ["--task", "shopping"])])
def test_a_synthetic_task_holds_out_what_threadweaver_synth_writes_with_its_defaults(tmp_path, task, flags):
    import subprocess

    import yaml

    from threadweaver.testing import CLI

    subprocess.run([CLI, "synth", "--out", str(tmp_path), *flags], check=True, capture_output=True)
    written = [json.loads(line) for line in (tmp_path / "parallel" / "validation.jsonl").read_text().splitlines()]
    kwargs = yaml.safe_load((discovery.TASKS_DIR / f"{task}.yaml").read_text())["dataset_kwargs"]
    generated = data.load(**kwargs)["test"]
    assert len(written) == len(generated) == 200
    assert [row["messages"] for row in written] == generated["messages"]


def test_the_trajectories_file_records_the_gold_answer_and_lm_evals_grade():
    from lm_eval.api.instance import Instance

    from threadweaver.lmeval_tasks.model import _graded

    def request(doc):
        return Instance("generate_until", doc, ("problem", {}), 0, ("tw_synth", 0, 1))

    assert _graded(request({"gold": "7"}), PARALLEL) == {"answer": "7", "correct": True}
    assert _graded(request({"gold": "8"}), PARALLEL) == {"answer": "8", "correct": False}
    assert scoring.process_results({"gold": "8"}, [PARALLEL])["acc"] == 0.0  # the same grade lm-eval reports
    assert _graded(request({"question": "a task of another suite"}), PARALLEL) == {}


def _load_aime24(**metadata):
    """tw_aime24's documents through lm-eval's own TaskManager."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_defaults=False, include_path=str(discovery.TASKS_DIR), metadata=metadata)
    return list(manager.load(["tw_aime24"])["tasks"]["tw_aime24"].test_docs())


def test_a_data_dir_without_the_tasks_file_is_an_error_not_the_hub(tmp_path, monkeypatch):
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path} has no tw_aime24.jsonl/.json/.parquet/.csv$"):
        _load_aime24(data_dir=str(tmp_path))
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="has no tw_aime24.jsonl"):
        _load_aime24()


def test_a_file_key_that_names_no_task_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"^unknown metadata tw_aime_file; known: .*tw_aime24_file, .*data_dir$"):
        _load_aime24(tw_aime_file=str(tmp_path / "aime.jsonl"))


def test_csv_errors_name_the_files_line(tmp_path):
    rows = tmp_path / "aime.csv"
    rows.write_text('Problem,Answer\n"two\nlines",1\n\nempty,\n')
    with pytest.raises(ValueError, match=r"aime.csv: line 5 has an empty 'Answer'"):
        _load_aime24(tw_aime24_file=str(rows))
    rows.write_text("Problem,Answer\n   \nfoo,1\nbar,\n")  # a line of spaces, which the reader skips
    with pytest.raises(ValueError, match=r"aime.csv: line 4 has an empty 'Answer'"):
        _load_aime24(tw_aime24_file=str(rows))
    rows.write_text('Problem,Answer\nfoo,1\n""\nbar,2\n')  # a quoted empty field, which it reads as a row
    with pytest.raises(ValueError, match=r"aime.csv: line 3 has an empty 'Problem'"):
        _load_aime24(tw_aime24_file=str(rows))


def test_a_csv_field_over_pythons_csv_limit_loads_and_a_bad_row_is_named_by_its_row(tmp_path):
    rows = tmp_path / "aime.csv"
    rows.write_text(f"Problem,Answer\n{'x' * 200_000},1\nbar,\n")
    with pytest.raises(ValueError, match=r"aime.csv: row 1 has an empty 'Answer'"):
        _load_aime24(tw_aime24_file=str(rows))
    rows.write_text(f"Problem,Answer\n{'x' * 200_000},1\n")
    assert len(_load_aime24(tw_aime24_file=str(rows))) == 1


def test_an_unreachable_hub_names_the_offline_options(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADWEAVER_")}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
    code = (
        "import sys; from lm_eval.tasks import TaskManager; "
        "TaskManager(include_path=sys.argv[1], include_defaults=False).load(['tw_aime24'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(discovery.TASKS_DIR)], env=env, capture_output=True, text=True
    )
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ConnectionError: tw_aime24: cannot reach the hub dataset Maxwell-Jia/AIME_2024")
    for option in (
        '"tw_aime24_file": "FILE"',
        "THREADWEAVER_TW_AIME24_FILE=FILE",
        '"data_dir"',
        "THREADWEAVER_DATA_DIR",
    ):
        assert option in last


@pytest.mark.parametrize(
    "raw, said",
    [
        (b"", "no rows"),
        (b'{"Problem": "a", "Answer": "1"}\n{"Problem": "b"}\n', "line 2 has no 'Answer'"),  # was "an empty"
        (
            b'{"Problem": "a", "Answer": 2}\n{"Problem": "b", "Answer": "5"}\n',
            "the rows do not form one table (line 2: 'Answer' is a string where line 1's is a number; ArrowInvalid",
        ),
    ],
    ids=["empty", "a row without the field", "a column of two types"],
)
def test_a_local_jsonl_file_says_what_is_wrong_where(tmp_path, raw, said):
    path = tmp_path / "aime.jsonl"
    path.write_bytes(raw)
    with pytest.raises(ValueError) as refused:
        data.load("tw_aime24", "Problem", "Answer", tw_aime24_file=str(path))
    assert str(refused.value).startswith(f"{path}: {said}"), str(refused.value)


def test_a_data_dir_that_does_not_exist_is_an_error_for_the_synthetic_tasks_too(tmp_path):
    """A synthetic task without its file in data_dir takes its generated problems; a data_dir that is not there
    is a typo, and the run went on without a word."""
    with pytest.raises(FileNotFoundError, match=f"^data_dir {tmp_path / 'nope'}: no such folder$"):
        data.load("tw_synth", "problem", "answer", synth={}, data_dir=str(tmp_path / "nope"))
