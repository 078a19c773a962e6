"""A scripted engine: test a host, an engine or the orchestrator without a model.

``ScriptedEngine(fmt, script)`` answers a request with the reply of the longest script key
its decoded context ends with, and honours the engine contract as vLLM does: a stop id
ends the completion (and is kept), ``max_tokens`` cuts it with ``"length"``. ``<EOS>`` in a
reply is the format's end-of-sequence token. For example, one well-formed block::

    head = "<Parallel><Outlines><Outline>1:a</Outline><Outline>2:b</Outline></Outlines>"
    engine = ScriptedEngine(fmt, {"Q?": "think " + head, "<Thread>1:": "aa</Thread>",
                                  "<Thread>2:": "bbbb</Thread>", "</Parallel>": " done<EOS>"})

:data:`CLI` is the ``threadweaver`` command beside the running interpreter; :func:`interrupted_once_written`
stops a command as Ctrl-C does once it has written its first row; :func:`logged` keeps what a logger says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

from threadweaver.engine import Completion, Sampling, to_completion
from threadweaver.format import Format


class ScriptedEngine:
    def __init__(self, fmt: Format, script: dict[str, str], delay: float = 0.0):
        """``delay``: seconds each request takes, so that concurrent requests overlap."""
        self.fmt, self.script, self.delay = fmt, script, delay
        self.calls: list[list[int]] = []
        """The context of every request, in the order they came."""

    async def generate(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> Completion:
        self.calls.append(list(prompt_ids))
        if self.delay:
            await asyncio.sleep(self.delay)
        context = self.fmt.decode(prompt_ids)
        keys = [key for key in self.script if context.endswith(key)]
        if not keys:
            raise KeyError(f"no script key ends the context {context[-80:]!r}")
        ids: list[int] = []
        for i, piece in enumerate(self.script[max(keys, key=len)].split("<EOS>")):
            ids += ([min(self.fmt.eos_ids)] if i else []) + self.fmt.encode(piece)
        end = next((i + 1 for i, token in enumerate(ids[:max_tokens]) if token in stop_ids), max_tokens)
        return to_completion(ids[:end], None, None, stop_ids, where="scripted engine")


class StreamingScriptedEngine(ScriptedEngine):
    """A :class:`ScriptedEngine` that also streams (``StreamingEngine``): one token every
    ``token_delay`` seconds, then the completion ``generate`` gives."""

    def __init__(self, fmt: Format, script: dict[str, str], token_delay: float = 0.0):
        super().__init__(fmt, script)
        self.token_delay = token_delay

    async def stream(
        self, prompt_ids: Sequence[int], stop_ids: Sequence[int], max_tokens: int, sampling: Sampling
    ) -> AsyncIterator[tuple[int, ...] | Completion]:
        completion = await self.generate(prompt_ids, stop_ids, max_tokens, sampling)
        for token in completion.token_ids:
            await asyncio.sleep(self.token_delay)
            yield (token,)
        yield completion


CLI = os.path.join(os.path.dirname(sys.executable), "threadweaver")
"""The ``threadweaver`` command of the running interpreter's environment."""


def interrupted_once_written(command: list[str], rows: str, wait_s: float = 60) -> tuple[int, str]:
    """Run ``command`` as from a terminal (SIGINT not ignored, as it is under a nohup'd CI), send it SIGINT once
    ``rows`` holds a finished line, and return its (exit status as a shell reports it, stderr): 130 for a command
    that exits so, and for one that Python's uncaught KeyboardInterrupt ends by SIGINT."""
    as_a_terminal = {"preexec_fn": lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **as_a_terminal)
    deadline = time.monotonic() + wait_s
    while not (os.path.exists(rows) and "\n" in Path(rows).read_text()) and process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"no row finished in {wait_s} s: {' '.join(command)}")
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    return process.returncode if process.returncode >= 0 else 128 - process.returncode, err


@contextlib.contextmanager
def logged(name: str) -> Iterator[list[str]]:
    """The messages logger ``name`` passes on to its handlers while inside (its filters applied). pytest's ``caplog``
    sees only what reaches the root logger, and transformers' loggers stop there unless ``CI`` is set."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
