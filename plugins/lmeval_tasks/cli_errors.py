"""lm-eval's CLI says a threadweaver error in one line, as ``threadweaver``'s own commands do.

lm-eval's CLI prints the traceback of whatever a model or a task's loader raises, above the message.
In that process only (not where a script uses lm-eval as a library), :func:`install` hooks
``sys.excepthook``: an error of bad input, settings or a server (:data:`SAID`) that threadweaver's own
code raised is printed as ``threadweaver: MESSAGE``, and Ctrl-C while its code ran as
``threadweaver: stopped``. Anything else keeps its traceback, an error another library raised under
threadweaver's code too.
"""

from __future__ import annotations

import os
import sys

from threadweaver.engine import EngineError

SAID = (ValueError, OSError, NotImplementedError, EngineError)
CLI_NAMES = ("lm_eval", "lm-eval")


def in_lm_eval_cli() -> bool:
    """Whether this process is lm-eval's CLI: its console script, or ``python -m lm_eval``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    argv = getattr(sys, "argv", None) or [""]
    return getattr(spec, "name", None) == "lm_eval.__main__" or os.path.basename(argv[0]) in CLI_NAMES


def install() -> None:
    """Hook ``sys.excepthook`` (idempotent)."""
    if getattr(sys.excepthook, "threadweaver_lmeval", False):
        return
    previous = sys.excepthook

    def said_in_one_line(kind, err, traceback):
        frames = _frames(traceback)
        if issubclass(kind, KeyboardInterrupt) and any(map(_threadweavers, frames)):
            notes = getattr(err, "__notes__", None) or []
            print("; ".join(["threadweaver: stopped", *notes]), file=sys.stderr)
        elif issubclass(kind, SAID) and frames and _threadweavers(frames[-1]):
            print("; ".join([f"threadweaver: {err}", *(getattr(err, "__notes__", None) or [])]), file=sys.stderr)
        else:
            previous(kind, err, traceback)

    said_in_one_line.threadweaver_lmeval = True
    sys.excepthook = said_in_one_line


def _frames(traceback) -> list:
    """The frames an error passed, outermost first: the last one raised it."""
    frames = []
    while traceback is not None:
        frames.append(traceback.tb_frame)
        traceback = traceback.tb_next
    return frames


def _threadweavers(frame) -> bool:
    return frame.f_globals.get("__name__", "").startswith("threadweaver.")
