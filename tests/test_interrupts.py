"""Stopping a command: the first Ctrl-C (or SIGTERM, where asked) cancels the coroutine and unwinds it."""

import asyncio
import os
import signal
import threading
import weakref

import pytest

from threadweaver.batch import run_sync
from threadweaver.interrupts import exit_status, interrupt_like_ctrl_c, raise_keyboard_interrupt, run_until_complete


@pytest.fixture
def stopping_signals_interrupt():
    """SIGTERM and SIGHUP interrupt as Ctrl-C does for the test (as ``serve.stop_on_exit`` asks), then as before."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    for signum in before:
        signal.signal(signum, signal.SIG_DFL)
    interrupt_like_ctrl_c(signal.SIGTERM, signal.SIGHUP)
    assert all(signal.getsignal(signum) is raise_keyboard_interrupt for signum in before)
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c", "sigterm", "sighup"])
def test_a_signal_that_lands_in_a_weakref_callback_still_stops_the_run(signum, request):
    """Python prints and drops a KeyboardInterrupt raised inside a weakref callback (or a ``__del__``):
    raised by the signal's own handler there, the signal was lost and the run went on. The first
    signal now cancels the task, which unwinds on its loop, and KeyboardInterrupt follows."""
    if signum != signal.SIGINT:
        request.getfixturevalue("stopping_signals_interrupt")
    handler = signal.getsignal(signum)
    unwound = []

    async def work():
        class Thing:
            pass

        def send_the_signal(_ref):
            os.kill(os.getpid(), signum)
            for _ in range(1000):  # Python runs the signal's handler here, inside the callback
                pass

        thing = Thing()
        ref = weakref.ref(thing, send_the_signal)
        del thing
        try:
            await asyncio.sleep(5)
        finally:
            await asyncio.sleep(0)  # the task unwinds on its loop: cleanup may still await
            unwound.append(ref)
        return "went on"

    with pytest.raises(KeyboardInterrupt) as raised:
        run_sync(work())
    assert unwound and signal.getsignal(signum) is handler
    assert raised.value.args == (() if signum == signal.SIGINT else (signal.Signals(signum).name,))
    assert exit_status(raised.value) == 128 + signum  # what a shell reports for a command the signal stopped


def test_a_second_signal_raises_at_once_while_the_task_unwinds(stopping_signals_interrupt):
    """The first signal cancels (the coroutine sees CancelledError, not KeyboardInterrupt); a cleanup
    that hangs is not waited for: the second signal raises inside it."""
    reached = []

    async def work():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(5)
        except BaseException as err:
            reached.append(type(err).__name__)
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(5)
            reached.append("cleanup done")

    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            run_until_complete(loop, work())
        assert reached == ["CancelledError"] and raised.value.args == ()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is raise_keyboard_interrupt
    finally:
        for task in asyncio.all_tasks(loop):  # the task left unwinding on the loop, as documented
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


def test_an_error_restores_the_handlers_and_a_handler_set_meanwhile_stays(stopping_signals_interrupt):
    mine = []

    async def work():
        signal.signal(signal.SIGHUP, lambda signum, frame: mine.append(signum))  # e.g. a library's own
        raise ValueError("the coroutine's own error")

    with pytest.raises(ValueError, match="own error"):
        run_sync(work())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is raise_keyboard_interrupt
    os.kill(os.getpid(), signal.SIGHUP)
    assert mine == [signal.SIGHUP]


def test_a_signal_someone_else_handles_is_left_alone():
    """A host's own SIGTERM handler (a trainer's, a server's) stays and runs; the coroutine finishes."""
    seen = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        interrupt_like_ctrl_c(signal.SIGTERM)

        async def work():
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.05)
            return "finished"

        assert run_sync(work()) == "finished"
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_off_the_main_thread_nothing_is_installed():
    """Python runs signal handlers on the main thread only: a worker thread leaves them as they are."""
    before = signal.getsignal(signal.SIGHUP)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        thread = threading.Thread(target=interrupt_like_ctrl_c, args=(signal.SIGHUP,))
        thread.start()
        thread.join()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, before)
