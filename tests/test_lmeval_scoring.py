"""The tw_* tasks' host-free parts: gold answers, local data files, metrics and the side channel.

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
    monkeypatch.setattr(measured, "_by_text", {})
    monkeypatch.setattr(measured, "_tokenizer", None)
    monkeypatch.setattr(measured, "_tokenizer_hint", None)
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


def test_a_named_local_file_that_is_missing_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="tw_aime24: the local dataset .*missing.jsonl does not exist"):
        data.local_file("tw_aime24", {"tw_aime24_file": str(tmp_path / "missing.jsonl")})


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
    measured.record(PARALLEL, stats, frozenset({"eos_in_thread"}))
    metrics = scoring.process_results({"gold": "7"}, [[PARALLEL]])
    assert metrics == {
        "acc": 1.0,
        "token_latency": 20.0,
        "total_tokens": 50.0,
        "speedup": 2.5,
        "parallel_activation": 1.0,
        "well_formed": 0.0,
        "stats_measured": 1.0,
        **{f"degraded_{kind}": float(kind == "eos_in_thread") for kind in DEGRADATION_KINDS},
    }


def test_the_task_template_declares_every_metric_the_tasks_return():
    template = (discovery.TASKS_DIR / "_tw_template").read_text()
    declared = re.findall(r"- metric: (\w+)\n\s+aggregation: mean\n\s+higher_is_better: (true|false)", template)
    assert dict(declared) == {name: str(higher).lower() for name, higher in scoring.HIGHER_IS_BETTER.items()}


def test_unmeasured_responses_are_tokenised_and_say_so(qwen):
    measured.use_tokenizer(qwen)
    stats = latency_stats(parse_text(PARALLEL, Format.from_tokenizer(qwen)).nodes)
    sequential = "<think>\nno blocks</think>\n\\boxed{8}"
    metrics = scoring.process_results({"gold": "7"}, [[PARALLEL, sequential]])
    n = len(qwen.encode(sequential, add_special_tokens=False))
    assert metrics["stats_measured"] == 0.0
    assert metrics["acc"] == 0.5
    assert metrics["token_latency"] == (stats.critical_path_tokens + n) / 2
    assert metrics["total_tokens"] == (stats.total_tokens + n) / 2
    assert metrics["speedup"] == pytest.approx((stats.speedup + 1.0) / 2)
    assert metrics["parallel_activation"] == 0.5 and metrics["well_formed"] == 1.0


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
    import sys

    import yaml

    cli = os.path.join(os.path.dirname(sys.executable), "threadweaver")
    subprocess.run([cli, "synth", "--out", str(tmp_path), *flags], check=True, capture_output=True)
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
