"""The embedded kit saved with save_pretrained loads back in real transformers, ids intact."""

import json
import subprocess

import pytest

from threadweaver.testing import CLI

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("which", ["synth", "qwen"])
def test_kit_loads_in_transformers(tmp_path, which):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from threadweaver.format import Format
    from threadweaver.kit.tokenizers import qwen_tokenizer, synth_tokenizer
    from threadweaver.tree import parse_text

    out = tmp_path / which
    flags = [
        "--hidden-size",
        "32",
        "--num-hidden-layers",
        "1",
        "--num-attention-heads",
        "2",
        "--num-key-value-heads",
        "1",
        "--intermediate-size",
        "64",
    ]
    subprocess.run([CLI, "kit", "--out", str(out), "--tokenizer", which, *flags], check=True, capture_output=True)
    tok = AutoTokenizer.from_pretrained(out)
    fresh = synth_tokenizer() if which == "synth" else qwen_tokenizer()
    text = (
        "<think>\n<Parallel><Outlines><Outline>1:A</Outline></Outlines><Thread>1:A=12+34 ;46</Thread></Parallel>\n"
        "</think>\n\\boxed{46}"
    )
    assert tok.encode(text) == fresh.encode(text)
    assert tok.chat_template == fresh.chat_template and tok.eos_token == "<|im_end|>"
    assert parse_text(text, Format.from_tokenizer(tok)).well_formed
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.model_type == "qwen3" and model.config.vocab_size >= len(tok)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode(text)])).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()
