"""How the plain ``lm_eval`` CLI finds the ``threadweaver`` model and the ``tw_*`` tasks.

lm-eval 0.4.13 has no plugin entry points: it takes models from its registry, which
it fills when ``lm_eval.models`` is imported, and tasks only from the directories a
``TaskManager`` is given. So a one-line ``threadweaver-lmeval.pth``, installed beside
the package, runs the source of :mod:`threadweaver.lmeval_tasks.autoload` at interpreter
start-up (without importing threadweaver). That installs an import hook which waits for
those two lm-eval modules and then

1. registers ``threadweaver`` in lm-eval's model registry, lazily (the model module is
   imported only when a run asks for it), and
2. makes every ``TaskManager`` also scan :data:`TASKS_DIR`, before the user's own
   ``--include_path`` directories, which can therefore override a ``tw_*`` task.

Nothing of lm-eval is imported before the user imports it. Set
``THREADWEAVER_LMEVAL_AUTOLOAD=0`` to switch the hook off and pass
``--include_path $(python -m threadweaver.lmeval_tasks path)`` instead.

``python -m threadweaver.lmeval_tasks install`` writes the ``.pth`` file where pip's
wheel would put it (editable installs do not carry it); ``status`` says whether it is
in place, ``remove`` deletes it, ``path`` prints the task directory.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sysconfig
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from threadweaver.hosts import check_host

from . import cli_errors
from .pth import PTH_NAME

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
MODEL_NAME = "threadweaver"
MODEL_TARGET = "threadweaver.lmeval_tasks.model:ThreadWeaverLM"


def register_model(_module: ModuleType | None = None) -> None:
    """Add ``threadweaver`` to lm-eval's model registry (idempotent; the hook's job, or call it yourself).

    lm-eval's own models go in first: ``get_model`` adds them only while the registry is empty.
    """
    check_host("lm_eval")
    from lm_eval.api.registry import model_registry

    importlib.import_module("lm_eval.models")

    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target=MODEL_TARGET)


def with_tasks_dir(include_path) -> list:
    """``include_path`` (None, a path or a list) as a list that starts with :data:`TASKS_DIR`."""
    if not include_path:
        paths = []
    elif isinstance(include_path, (list, tuple)):
        paths = list(include_path)
    else:
        paths = [include_path]
    if any(Path(p).expanduser().resolve() == TASKS_DIR for p in paths):
        return paths
    return [str(TASKS_DIR), *paths]


def add_tasks_dir(manager_module: ModuleType) -> None:
    """Make ``TaskManager(...)`` also scan :data:`TASKS_DIR` (idempotent)."""
    check_host("lm_eval")
    cls = manager_module.TaskManager
    original = cls.__init__
    if getattr(original, "_threadweaver_tasks", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments["include_path"] = with_tasks_dir(bound.arguments.get("include_path"))
        original(*bound.args, **bound.kwargs)

    __init__._threadweaver_tasks = True
    cls.__init__ = __init__


HOOKS: dict[str, Callable[[ModuleType], None]] = {
    "lm_eval.models": register_model,
    "lm_eval.tasks.manager": add_tasks_dir,
}


def run_hook(module: ModuleType) -> None:
    """Run the hook for a freshly imported lm-eval module; a failure warns, never breaks lm-eval. In lm-eval's
    CLI, threadweaver's errors are then said in one line (:mod:`.cli_errors`)."""
    try:
        HOOKS[module.__name__](module)
        if cli_errors.in_lm_eval_cli():
            cli_errors.install()
    except Exception as err:
        warnings.warn(
            f"threadweaver could not hook into {module.__name__} ({type(err).__name__}: {err}); "
            f"use --include_path {TASKS_DIR}",
            RuntimeWarning,
            stacklevel=2,
        )


def pth_path() -> Path:
    """Where pip puts a wheel's top-level ``.pth`` file in this environment."""
    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
