"""Packaging: a light core import, plugin and application folders mapped into the namespace, none forgotten."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

HEAVY = ["torch", "transformers", "trl", "vllm", "verl", "lm_eval", "sglang", "tokenizers", "math_verify", "sympy"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_threadweaver_imports_no_host():
    code = (
        "import sys, json, threadweaver as tw\n"
        "tw.Format, tw.parse, tw.plan_requests, tw.trajectory_trie, tw.latency_stats, tw.grade, tw.Orchestrator\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == []


def test_engines_import_from_the_engines_package_and_load_only_their_own_host():
    """``from threadweaver.vllm_orchestrator import VLLMServerEngine`` (as the README names them) loads no vLLM."""
    code = (
        "import sys, json\n"
        "from threadweaver.vllm_orchestrator import PUBLIC_NAMES, VLLMServerEngine, SGLangEngine\n"
        "from threadweaver.vllm_orchestrator import HTTPOptions, Replicas\n"
        "from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine as defined\n"
        "assert VLLMServerEngine is defined\n"
        f"print(json.dumps([sorted(PUBLIC_NAMES), sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})]))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    names, heavy = json.loads(out)
    assert "vllm" not in heavy and "torch" not in heavy
    from threadweaver import vllm_orchestrator

    for name in names:
        assert getattr(vllm_orchestrator, name).__name__ == name
    with pytest.raises(ImportError, match="cannot import name 'Nope'"):
        from threadweaver.vllm_orchestrator import Nope  # noqa: F401


@pytest.mark.parametrize("plugin", ["hf_collator", "trl_pgrpo", "verl_rollout", "vllm_orchestrator", "lmeval_tasks"])
def test_plugin_folders_are_threadweaver_subpackages(plugin):
    module = __import__(f"threadweaver.{plugin}", fromlist=["_"])
    assert os.path.dirname(module.__file__) == os.path.join(ROOT, "plugins", plugin)


@pytest.mark.parametrize("app", ["cli", "quickstart", "curate", "view", "prepare"])
def test_application_folders_are_threadweaver_subpackages(app):
    module = __import__(f"threadweaver.{app}", fromlist=["_"])
    assert os.path.dirname(module.__file__) == os.path.join(ROOT, "apps", app)


def test_every_package_folder_is_listed_for_the_wheel():
    """A folder left out of pyproject.toml's list is left out of the wheel (``threadweaver.curate`` once was)."""
    setuptools = tomllib.loads(Path(ROOT, "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"threadweaver": "threadweaver", **setuptools["package-dir"]}
    found = set()
    for package, folder in folders.items():
        for init in Path(ROOT, folder).rglob("__init__.py"):
            parts = init.parent.relative_to(Path(ROOT, folder)).parts
            found.add(".".join((package, *parts)))
    assert found == set(setuptools["packages"])
