"""The import contract (README, "Layers"), read off every module's imports, lazy ones included.

* The core (``threadweaver/`` less the command line and the quickstart) imports no plugin
  and no host framework, and torch or transformers only inside functions.
* A plugin imports the core, its own hosts, and another plugin only where its host builds
  on that one's: trl_pgrpo on hf_collator (TRL runs on transformers), and trl_pgrpo and
  lmeval_tasks on the engines in vllm_orchestrator.
* Nothing but the command line and the quickstart imports them: they are the top layer.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HOSTS = {"trl", "verl", "vllm", "sglang", "lm_eval"}
LAZY_ONLY = {"torch", "transformers"}
"""What the core may import, but only inside a function, so ``import threadweaver`` stays light."""
PLUGINS = {
    # plugin: (the host frameworks it may import, the plugins it may import)
    "hf_collator": ({"trl"}, set()),
    "vllm_orchestrator": ({"vllm", "sglang"}, set()),
    "trl_pgrpo": ({"trl", "vllm"}, {"hf_collator", "vllm_orchestrator"}),
    "lmeval_tasks": ({"lm_eval"}, {"vllm_orchestrator"}),
    "verl_rollout": ({"verl"}, set()),
}
TOP = {"threadweaver.cli", "threadweaver.quickstart", "threadweaver.self_train"}


def modules() -> dict[str, Path]:
    """Every module of the distribution, by its import name."""
    found = {}
    for base, package in [
        (ROOT / "threadweaver", "threadweaver"),
        *((ROOT / "plugins" / p, f"threadweaver.{p}") for p in PLUGINS),
    ]:
        for path in base.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            found[".".join((package, *parts)).removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported module, whether at module level) for each import in ``path``."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])]
                )
            out += [(f"{base}.{alias.name}", id(node) in top_level) for alias in node.names]
    return out


def owner(module: str) -> str:
    """``core``, ``top``, a plugin's name, or the top-level name of a third-party module."""
    parts = module.split(".")
    if parts[0] != "threadweaver":
        return parts[0]
    if len(parts) > 1 and parts[1] in PLUGINS:
        return parts[1]
    return "top" if ".".join(parts[:2]) in TOP else "core"


EDGES = [(name, imported, top) for name, path in modules().items() for imported, top in imports(name, path)]


@pytest.mark.parametrize("layer", ["core", *PLUGINS])
def test_each_layer_imports_only_what_the_contract_allows(layer):
    hosts, plugins = PLUGINS.get(layer, (set(), set()))
    broken = []
    for name, imported, top in EDGES:
        if owner(name) != layer:
            continue
        target = owner(imported)
        if target == "top" or (target in PLUGINS and target != layer and target not in plugins):
            broken.append(f"{name} imports {imported}")
        elif target in HOSTS - hosts or (layer == "core" and top and target in LAZY_ONLY):
            broken.append(f"{name} imports {imported}" + (" at module level" if top else ""))
    assert broken == []


def test_the_walk_sees_the_layers():
    """The contract is not vacuous: the walk finds the imports it is about."""
    seen = {(owner(name), owner(imported)) for name, imported, _ in EDGES}
    assert {("trl_pgrpo", "hf_collator"), ("lmeval_tasks", "vllm_orchestrator"), ("top", "trl_pgrpo")} <= seen
    assert {("trl_pgrpo", "trl"), ("verl_rollout", "verl"), ("core", "transformers")} <= seen
