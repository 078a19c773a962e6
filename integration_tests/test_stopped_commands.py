"""A command stopped mid-run leaves no server behind.

``threadweaver quickstart`` starts two vLLM servers, each in a process group of its own (so a
terminal's Ctrl-C reaches them only through it). Stopped by SIGTERM (``timeout``, a job
scheduler, a cancelled CI job), SIGHUP (a closed terminal) or SIGINT while they run, it must stop
them. Every command, bench and test fixture starts its servers through the same
``serve.VLLMServer``, which stops them on these signals and at exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vllm_server import NO_VLLM, have_vllm

from threadweaver.testing import CLI
from threadweaver.vllm_orchestrator.serve import group_alive


def servers_of(pid: int) -> list[int]:
    """The vLLM API servers whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and "vllm.entrypoints.openai.api_server" in command:
            found.append(int(entry.name))
    return found


def from_a_terminal() -> None:
    """``preexec_fn``: the command takes SIGHUP as one started from a terminal does, even in a test run
    started with ``nohup``, which ignores it for every process it starts (and a command rightly keeps
    an ignored SIGHUP: ``interrupt_like_ctrl_c`` handles only signals nothing else does)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_quickstart_stopped_mid_run_leaves_no_server_running(tmp_path, signum):
    if not have_vllm():
        pytest.skip(NO_VLLM)
    command = [CLI, "quickstart", "--problems", "1", "--out", str(tmp_path / "out")]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=from_a_terminal
    )
    deadline = time.monotonic() + 120
    while len(servers := servers_of(process.pid)) < 2:
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the quickstart started no servers"
        time.sleep(0.5)
    time.sleep(3)  # the servers are starting: their engine cores are being made
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signum  # as a shell reports a command a signal stopped
    assert "Traceback" not in err, err[-3000:]
    deadline = time.monotonic() + 10
    while any(group_alive(pid) for pid in servers) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [pid for pid in servers if group_alive(pid)], "servers left running"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_test_run_stopped_mid_test_tears_its_fixtures_down(tmp_path, signum):
    """A cancelled CI job sends pytest SIGTERM: the servers its fixtures started must stop with it."""
    here = Path(__file__).parent
    pid_file = tmp_path / "server.pid"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "python_files=stop_probe.py"]
    env = {**os.environ, "STOP_PROBE_PID": str(pid_file)}
    run = subprocess.Popen(
        [*command, str(here / "stop_probe.py")],
        cwd=here.parent,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=from_a_terminal,
    )
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()[-3000:]
        time.sleep(0.2)
    server = int(pid_file.read_text())
    assert alive(server)
    run.send_signal(signum)
    output = run.communicate(timeout=60)[0]
    assert not alive(server), output[-3000:]
