"""Run by test_stopped_commands.py in a pytest of its own (not collected here): a fixture starts a
server-like process in a session of its own and stops it in its teardown; the test waits."""

from __future__ import annotations

import os
import subprocess
import time

import pytest


@pytest.fixture
def server():
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    with open(os.environ["STOP_PROBE_PID"], "w") as f:
        f.write(str(process.pid))
    try:
        yield process
    finally:
        process.terminate()
        process.wait()


def test_waits_to_be_stopped(server):
    time.sleep(600)
