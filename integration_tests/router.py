"""A real router process (vllm-router or SGLang's router, both PyPI wheels) in front of loopback servers."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from threadweaver.vllm_orchestrator.serve import free_port

LAUNCH = {"vllm-router": [], "sglang-router": ["launch"]}
"""Each router's executable, and the subcommand that starts it routing over ``--worker-urls``."""


def router_command(name: str) -> str | None:
    """The router's executable: in this venv's bin (beside the running Python), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


@contextmanager
def router(name: str, worker_urls: list[str], policy: str, log_path: str, startup_s: float = 60):
    """``name`` (``vllm-router`` or ``sglang-router``) routing over ``worker_urls`` with ``policy``; yields its URL."""
    port = free_port("127.0.0.1")
    command = [router_command(name), *LAUNCH[name], "--host", "127.0.0.1", "--port", str(port)]
    command += ["--worker-urls", *worker_urls, "--prometheus-port", str(free_port("127.0.0.1"))]
    command += ["--policy", policy]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with code {process.returncode}: {Path(log_path).read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} was not up after {startup_s:.0f}s") from None
                time.sleep(0.3)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def server_counters(server_url: str) -> dict[str, float]:
    """A vLLM server's own counters from its /metrics: prompt tokens its prefix cache looked up
    (``queries``) and found (``hits``), and requests it finished (``requests``)."""
    with urllib.request.urlopen(server_url + "/metrics", timeout=10) as response:
        text = response.read().decode()

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^vllm:{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))

    return {
        "queries": total("prefix_cache_queries_total"),
        "hits": total("prefix_cache_hits_total"),
        "requests": total("request_success_total"),
    }
