"""lm-eval's CLI says a threadweaver error in one line, as ``threadweaver``'s own commands do.

lm-eval's CLI prints the traceback of whatever a model or a task's loader raises, above the message.
In that process only (not where a script uses lm-eval as a library), :func:`install` hooks
``sys.excepthook``: an error of bad input, settings or a server (:data:`SAID`) raised while
threadweaver's code ran is printed as ``threadweaver: MESSAGE``, and Ctrl-C as ``threadweaver: stopped``.
Anything else keeps its traceback.
"""

from __future__ import annotations

import os
import sys

from threadweaver.engine import EngineError

SAID = (ValueError, OSError, NotImplementedError, EngineError, KeyboardInterrupt)
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
        if not (issubclass(kind, SAID) and _passed_threadweaver(traceback)):
            previous(kind, err, traceback)
        elif issubclass(kind, KeyboardInterrupt):
            print("threadweaver: stopped", file=sys.stderr)
        else:
            print(f"threadweaver: {err}", file=sys.stderr)

    said_in_one_line.threadweaver_lmeval = True
    sys.excepthook = said_in_one_line


def _passed_threadweaver(traceback) -> bool:
    """Whether the error came out of threadweaver's code (lm-eval called it, and it raised)."""
    while traceback is not None:
        if traceback.tb_frame.f_globals.get("__name__", "").startswith("threadweaver."):
            return True
        traceback = traceback.tb_next
    return False
