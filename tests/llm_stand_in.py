"""A stand-in for an OpenAI-compatible chat server on loopback that knows the synthetic task.

For a synthetic problem it answers each ``curate`` stage the way a perfect LLM would: the block
is the run of ``X=a+b ...`` lines, one thread each; no edits (the threads are independent); the
outlines are the labels. ``faults`` maps a problem to a way of getting it wrong, from the reply
(bad spans or edits, malformed JSON, a truncated reply) to the transport (429, 500, a timeout).
It counts the requests it answered, per stage.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from collections import Counter
from contextlib import contextmanager

_UNIT = re.compile(r"^\[(\d+)\] (.*)$", re.M)
_THREAD = re.compile(r"^Thread (\d+):\n(.*?)(?=\n\nThread \d+:\n|\Z)", re.M | re.S)
_SUM = re.compile(r"^[A-H]=\d+\+\d+ ")

FAULTS = (
    "off_by_one",
    "overlap",
    "one_thread",
    "edit_absent",
    "edit_ambiguous",
    "bad_json",
    "truncated",
    "outline_count",
    "429",
    "429_once",
    "500",
    "timeout",
    "web_page",
    "refusal",
    "no_usage",
    "401",
)


def answer(stage: str, user: str, fault: str | None) -> str:
    """The JSON content of the reply to one stage's user message."""
    if stage == "segment":
        lines = [int(n) for n, text in _UNIT.findall(user) if _SUM.match(text)]
        threads = [{"first": n, "last": n} for n in lines]
        if fault == "off_by_one":
            threads[1] = {"first": threads[1]["first"] + 1, "last": threads[1]["last"] + 1}
        if fault == "overlap":
            threads[1] = {"first": threads[0]["first"], "last": threads[1]["last"]}
        if fault == "one_thread":
            threads = threads[:1]
        return json.dumps({"blocks": [{"threads": threads}]})
    if stage == "decouple":
        if fault == "edit_absent":
            return json.dumps({"edits": [{"thread": 2, "find": "the result of thread 1", "replace": "x"}]})
        if fault == "edit_ambiguous":
            return json.dumps({"edits": [{"thread": 1, "find": "+", "replace": " plus "}]})
        return json.dumps({"edits": []})
    threads = _THREAD.findall(user)
    outlines = [text.split("=", 1)[0] for _, text in threads]
    if fault == "outline_count":
        outlines = outlines[:-1]
    return json.dumps({"outlines": outlines})


class StandIn:
    def __init__(self, faults: dict[str, str] | None = None, timeout_sleep_s: float = 3.0):
        self.faults = faults or {}
        self.timeout_sleep_s = timeout_sleep_s
        self.answered: Counter = Counter()
        self.seen_429: set[str] = set()
        self.lock = threading.Lock()

    def fault_for(self, user: str) -> str | None:
        problem = user.split("\n\n", 1)[0].removeprefix("Problem:\n")
        return self.faults.get(problem)

    def reply(self, body: dict) -> tuple[int, dict, dict | bytes]:
        """(status, headers, JSON body, or the bytes of another) for one chat completion request."""
        stage = body["response_format"]["json_schema"]["name"]
        user = body["messages"][1]["content"]
        fault = self.fault_for(user)
        if fault in ("429", "429_once"):
            with self.lock:
                first = user not in self.seen_429
                self.seen_429.add(user)
            if fault == "429" or first:
                return 429, {"Retry-After": "0"}, {"error": {"message": "slow down", "type": "rate_limit"}}
        if fault == "401":
            return 401, {}, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}
        if fault == "500" and stage == "segment":
            return 500, {}, {"error": {"message": "engine died", "type": "server_error"}}
        if fault == "timeout" and stage == "segment":
            time.sleep(self.timeout_sleep_s)
        if fault == "web_page" and stage == "segment":  # a web server at the address: 200, HTML
            return 200, {"Content-Type": "text/html"}, b"<!doctype html><title>Welcome</title><p>It works!"
        content, finish = answer(stage, user, fault), "stop"
        if fault == "bad_json" and stage == "segment":
            content = content.replace('"blocks"', "blocks")
        if fault == "truncated" and stage == "outline":
            content, finish = content[: len(content) // 2], "length"
        with self.lock:
            self.answered[stage] += 1
        usage = {"prompt_tokens": len(user) // 4, "completion_tokens": len(content) // 4, "total_tokens": 0}
        message = {"role": "assistant", "content": content}
        if fault == "refusal" and stage == "segment":  # OpenAI's structured outputs: a refusal, no content
            message = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
        choice = {"index": 0, "message": message, "finish_reason": finish}
        completion = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"], "choices": [choice]}
        return 200, {}, completion if fault == "no_usage" else {**completion, "usage": usage}


@contextmanager
def stand_in_server(stand_in: StandIn):
    """Serve ``stand_in`` on a free loopback port; yields the base URL (``.../v1``)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (the standard library's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, headers, payload = stand_in.reply(body)
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            try:
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout)
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
