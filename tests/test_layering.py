"""The import contract (README, "Layers"), read off every module's imports, lazy ones included.

A module's layer is the folder it lies in:

* the core (``threadweaver/``) imports no plugin, no application and no host framework, and
  torch or transformers only inside functions;
* a plugin (``plugins/<name>``) imports the core, its own hosts, and another plugin only where
  its host builds on that one's: trl_pgrpo on hf_collator (TRL runs on transformers), and
  trl_pgrpo and lmeval_tasks on the engines in vllm_orchestrator;
* the applications (``apps/<name>``) compose them; no core module or plugin imports one.

And no imports form a cycle.
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
APPS = sorted(path.name for path in (ROOT / "apps").iterdir() if (path / "__init__.py").exists())


def modules() -> dict[str, tuple[Path, str]]:
    """Every module of the distribution, by its import name: (its file, its layer)."""
    found = {}
    folders = [(ROOT / "threadweaver", "threadweaver", "core")]
    folders += [(ROOT / "plugins" / p, f"threadweaver.{p}", p) for p in PLUGINS]
    folders += [(ROOT / "apps" / a, f"threadweaver.{a}", "top") for a in APPS]
    for base, package, layer in folders:
        for path in base.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            found[".".join((package, *parts)).removesuffix(".__init__")] = (path, layer)
    return found


MODULES = modules()


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


def module_of(name: str) -> str | None:
    """The distribution's module that ``name`` (a module, or a name imported from one) is in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def owner(module: str) -> str:
    """``core``, ``top``, a plugin's name (by folder), or the top-level name of a third-party module."""
    if module.split(".")[0] != "threadweaver":
        return module.split(".")[0]
    return MODULES[module_of(module)][1]


EDGES = [(name, imported, top) for name, (path, _) in MODULES.items() for imported, top in imports(name, path)]


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


def test_imports_form_no_cycle():
    """Lazy imports included: a cycle through a function is still two modules that need each other."""
    graph: dict[str, set[str]] = {}
    for name, imported, _ in EDGES:
        target = module_of(imported) if imported.startswith("threadweaver") else None
        if target and target != name and not target.startswith(name + "."):
            graph.setdefault(name, set()).add(target)
    cycles, done, path = [], set(), []

    def visit(node: str) -> None:
        if node in path:
            cycles.append(" -> ".join(path[path.index(node) :] + [node]))
            return
        if node in done:
            return
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)
    assert cycles == []


def test_every_package_folder_is_a_layer():
    """Nothing lies outside the three folders, each application is a package there, and each plugin has its
    contract here (a plugin missing from PLUGINS would go unread)."""
    assert {"cli", "quickstart", "curate", "convert", "view", "self_train"} <= set(APPS)
    assert {path.name for path in (ROOT / "plugins").iterdir() if (path / "__init__.py").exists()} == set(PLUGINS)
    assert not set(APPS) & set(PLUGINS)


def test_every_third_party_import_is_a_declared_dependency():
    """What the package imports, lazily too, is in pyproject.toml's dependencies or an extra
    (``packaging``, imported by the host checks, once was not)."""
    import sys
    from importlib.metadata import packages_distributions

    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    declared = {canonicalize_name(Requirement(r).name) for r in requirements}
    provides = packages_distributions()
    undeclared = {}
    for name, imported, _ in EDGES:
        root = imported.split(".")[0]
        if root in sys.stdlib_module_names or root in ("threadweaver", "__future__"):
            continue
        distributions = {canonicalize_name(d) for d in provides.get(root, [root])}
        if not distributions & declared:
            undeclared.setdefault(root, name)
    assert undeclared == {}
