"""Stopping a command: Ctrl-C, and SIGTERM or SIGHUP where asked, cancel its coroutine and unwind it.

Python's own Ctrl-C handler raises KeyboardInterrupt wherever the main thread is. Where that is
a weakref callback or a ``__del__``, Python prints the exception and drops it, and the command
goes on (seen in ``curate``). :func:`run_until_complete` therefore turns the first such signal
into a cancellation of the running task, which unwinds (its ``finally`` blocks may still await),
and raises KeyboardInterrupt after. A second signal raises at once.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from typing import Any

STOPPING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
"""A job scheduler's and a closed terminal's: the signals :func:`interrupt_like_ctrl_c` can make interrupt
(SIGINT does already; Windows has no SIGHUP)."""


def raise_keyboard_interrupt(signum: int, _frame) -> None:
    """A signal handler: the signal interrupts the program as Ctrl-C does."""
    raise _interrupt(signum)


def _interrupt(signum: int) -> KeyboardInterrupt:
    """Ctrl-C's KeyboardInterrupt as Python raises it; another signal's names the signal."""
    return KeyboardInterrupt() if signum == signal.SIGINT else KeyboardInterrupt(signal.Signals(signum).name)


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The status a shell gives a command that a signal stopped: 128 + the signal's number (130 for
    Ctrl-C, 143 for SIGTERM), so that scripts and job schedulers tell a stop from a failure."""
    name = interrupt.args[0] if interrupt.args else ""
    signum = signal.Signals.__members__.get(name, signal.SIGINT) if isinstance(name, str) else signal.SIGINT
    return 128 + signum


class Stopped(Exception):
    """A run that a signal stopped, having kept what it finished: its message says where that is and
    how to go on; a command prints it and exits with :attr:`status`."""

    def __init__(self, message: str, interrupt: KeyboardInterrupt):
        super().__init__(message)
        self.interrupt, self.status = interrupt, exit_status(interrupt)


def interrupt_like_ctrl_c(*signums: signal.Signals) -> None:
    """On the main thread, make each of ``signums`` that nothing else handles interrupt as Ctrl-C does
    (a job scheduler's SIGTERM, a closed terminal's SIGHUP), so that ``with`` blocks and ``finally``
    clauses run; :func:`run_until_complete` cancels its task first."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in signums:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, raise_keyboard_interrupt)


def _interrupting() -> dict[signal.Signals, Any]:
    """The signals whose handler now raises KeyboardInterrupt, and that handler."""
    handlers = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
    handlers.update((signum, signal.getsignal(signum)) for signum in STOPPING_SIGNALS)
    ours = (signal.default_int_handler, raise_keyboard_interrupt)
    return {signum: handler for signum, handler in handlers.items() if handler in ours}


def run_until_complete(loop: asyncio.AbstractEventLoop, coroutine: Coroutine):
    """``loop.run_until_complete(coroutine)``, where the first interrupting signal cancels the
    coroutine (as ``asyncio.run`` does for Ctrl-C) and KeyboardInterrupt is raised once it has
    unwound. Off the main thread, or where no signal interrupts, it is the plain call.

    A second signal raises at once and leaves the task, still unwinding, on ``loop``: a caller
    that must see its cleanup through runs the loop until it is done (``curate`` does).
    """
    on_main = threading.current_thread() is threading.main_thread()
    handlers = _interrupting() if on_main else {}
    if not handlers:
        return loop.run_until_complete(coroutine)
    task: asyncio.Task | None = None
    interrupted: list[int] = []

    def cancel(signum, _frame):
        if interrupted or task is None or task.done():
            raise _interrupt(signum)
        interrupted.append(signum)
        task.cancel()
        loop.call_soon_threadsafe(lambda: None)  # wake the loop from its wait

    replaced = {}
    try:
        for signum, handler in handlers.items():  # a signal meanwhile raises here, and nothing has run
            signal.signal(signum, cancel)
            replaced[signum] = handler
        task = loop.create_task(coroutine)
        result = loop.run_until_complete(task)
    except asyncio.CancelledError:
        if interrupted:
            raise _interrupt(interrupted[0]) from None
        raise
    finally:
        for signum, handler in replaced.items():
            if signal.getsignal(signum) is cancel:  # a handler set during the run stays
                signal.signal(signum, handler)
        if task is None:
            coroutine.close()
    if interrupted:  # the coroutine caught its cancellation and finished
        raise _interrupt(interrupted[0])
    return result
