"""The package a user installs: the sdist, the wheel built from it with build isolation, and that
wheel installed by pip (not editable) into a fresh venv (``wheel_venv``). Every module imports,
every subcommand answers ``--help``, and verl and vLLM find the entry points. lm-eval finding the
tasks and the model through the wheel's start-up hook is tested in test_lmeval_tasks.py."""

from __future__ import annotations

import json
import subprocess
import tarfile
import zipfile

import pytest
from wheel_venv import REPO, built, wheel_venv

from threadweaver.cli import COMMANDS

pytestmark = pytest.mark.slow

VERL_EXTRA = {"verl", "omegaconf", "pandas", "cachetools", "uvicorn", "fastapi"}
"""verl has a venv of its own: here a verl_rollout module may miss what only the [verl] extra brings."""

IMPORT_ALL = """
import importlib, json, pkgutil, threadweaver
failed, walked = {}, []
for module in pkgutil.walk_packages(threadweaver.__path__, "threadweaver."):
    if module.name.endswith(".__main__"):  # run by python -m, not imported
        continue
    walked.append(module.name)
    try:
        importlib.import_module(module.name)
    except ModuleNotFoundError as err:
        failed[module.name] = err.name
    except Exception as err:
        failed[module.name] = f"{type(err).__name__}: {err}"
print(json.dumps({"file": threadweaver.__file__, "failed": failed, "walked": walked}))
"""

ENTRY_POINTS = """
import json
from importlib.metadata import entry_points
print(json.dumps({group: {e.name: e.value for e in entry_points(group=group)}
                  for group in ("verl.plugins", "vllm.endpoint_plugins", "console_scripts")}))
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    return wheel_venv(tmp_path_factory.mktemp("wheel"))


def run(python, *args, cwd) -> str:
    done = subprocess.run([python, *args], capture_output=True, text=True, cwd=cwd)
    assert done.returncode == 0, f"{args}: {done.stderr[-2000:]}"
    return done.stdout


def test_the_sdist_and_the_wheel_carry_every_package_and_the_start_up_hook():
    sdist, wheel = built()
    folders = {path.parent for path in (REPO / "threadweaver").rglob("__init__.py")}
    folders |= {path.parent for top in ("plugins", "apps") for path in (REPO / top).rglob("__init__.py")}
    in_sdist = set(tarfile.open(sdist).getnames())
    for folder in folders:
        assert any(name.endswith(f"{folder.relative_to(REPO)}/__init__.py") for name in in_sdist), folder
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "threadweaver-lmeval.pth" in names
    assert {"threadweaver/curate/run.py", "threadweaver/cli/__main__.py", "threadweaver/view/page.js"} <= names
    assert any(n.startswith("threadweaver/quickstart/models/parallel/") for n in names)


def checkout_modules() -> set[str]:
    """The import names of this checkout's modules (the core's, each plugin's, each app's), as the wheel maps them;
    not ``__main__`` ones."""
    folders = [(REPO / "threadweaver", "threadweaver")]
    folders += [
        (init.parent, f"threadweaver.{init.parent.name}")
        for top in ("plugins", "apps")
        for init in (REPO / top).glob("*/__init__.py")
    ]
    names = set()
    for base, package in folders:
        for path in base.rglob("*.py"):
            inside = path.relative_to(base)
            if all((base / folder / "__init__.py").exists() for folder in inside.parents):  # in packages alone
                names.add(".".join((package, *inside.with_suffix("").parts)).removesuffix(".__init__"))
    return {name for name in names if name != "threadweaver" and not name.endswith(".__main__")}


def test_every_module_of_the_installed_wheel_imports(venv, tmp_path):
    python, site = venv
    result = json.loads(run(python, "-c", IMPORT_ALL, cwd=tmp_path))
    assert result["file"].startswith(str(site))  # the wheel's copy, not this checkout
    assert set(result["walked"]) == checkout_modules()  # a package the wheel left out imports nothing to fail
    failed = result["failed"]
    assert {name: why for name, why in failed.items() if not name.startswith("threadweaver.verl_rollout.")} == {}
    assert set(failed.values()) <= VERL_EXTRA


@pytest.mark.parametrize("command", [None, *(c.name for c in COMMANDS)])
def test_every_subcommand_of_the_installed_wheel_answers_help(venv, tmp_path, command):
    python, _ = venv
    script = python.parent / "threadweaver"
    out = subprocess.run(
        [script, *([command] if command else []), "--help"], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout and "Traceback" not in out.stderr


def test_verl_and_vllm_find_the_installed_entry_points(venv, tmp_path):
    python, _ = venv
    groups = json.loads(run(python, "-c", ENTRY_POINTS, cwd=tmp_path))
    assert groups["verl.plugins"]["threadweaver"] == "threadweaver.verl_rollout.plugin"
    assert groups["vllm.endpoint_plugins"]["threadweaver"].startswith("threadweaver.vllm_orchestrator.endpoint_plugin:")
    assert groups["console_scripts"]["threadweaver"] == "threadweaver.cli:main"
