"""``threadweaver proxy`` as a process, as an operator runs it, for tests and benches."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from threadweaver.testing import CLI

PROXY_STARTS_WITHIN_S = 120
"""How long a proxy may take to say it listens (it loads its tokenizer first, on cores the tests share)."""


@contextmanager
def running_proxy(
    *args: str, log_path: str | os.PathLike | None = None, stop_within_s: float = 30
) -> Iterator[tuple[subprocess.Popen, str]]:
    """``threadweaver proxy`` with ``args`` on a free port (the one it prints), once it listens: its process and URL.

    Its stderr goes to ``log_path`` (by default a temporary file). If it exits, or does not say it listens
    within :data:`PROXY_STARTS_WITHIN_S`, an ``AssertionError`` holds what it printed. On leaving, it is stopped as an
    operator stops it (Ctrl-C), given ``stop_within_s`` to exit, then killed."""
    command = [CLI, "proxy", "--port", "0", *args]
    log = open(log_path, "w+") if log_path is not None else tempfile.TemporaryFile("w+")
    as_from_a_terminal = {"preexec_fn": _hang_up_as_by_default} if hasattr(signal, "SIGHUP") else {}
    with log, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, **as_from_a_terminal) as process:
        try:
            listening = select.select([process.stdout], [], [], PROXY_STARTS_WITHIN_S)[0]
            line = process.stdout.readline() if listening else ""
            if not line.startswith("http://"):
                log.seek(0)
                raise AssertionError(f"threadweaver proxy did not start: {line}{log.read()}")
            yield process, line.split()[0]
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=stop_within_s)
            finally:
                process.kill()


def _hang_up_as_by_default() -> None:
    """SIGHUP as a terminal's process has it, where the tests run under ``nohup`` (which ignores it)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
