"""The stages are layers: every import between orchestrator's packages points down.

Read from the source with ``ast`` (function-local imports included, since a
lazy import is an arrow all the same), so the rule holds for what the code
does, not for what a docstring says. From the ground up:

- the foundation modules (``errors``, ``settings``, ``atomic``, ...) and
  ``sdk`` (the cloud SDKs, imported lazily) import no stage;
- ``analysis`` (the statistics) and ``catalog`` (machines, prices, their fetchers)
  stand on them;
- ``providers`` read the catalog, never spec, plan or results;
- ``spec`` reads the catalog and analysis, never engine, providers or results;
- ``plan`` reads spec, catalog and analysis, never the engine;
- ``results`` reads plan, spec, catalog and analysis, never the engine;
- ``engine`` drives them all; ``cli`` and ``notebook`` sit on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "orchestrator"

FOUNDATION = {"errors", "formatting", "atomic", "packaged", "settings", "ray_support"}
TOP = {"cli", "notebook", "__main__"}

# package -> the packages it may import (itself and the foundation always)
ALLOWED: dict[str, set[str]] = {
    "sdk": set(),
    "analysis": set(),
    "catalog": {"sdk"},
    "providers": {"sdk", "catalog"},
    "spec": {"sdk", "catalog", "analysis"},
    "plan": {"sdk", "catalog", "analysis", "spec"},
    "results": {"catalog", "analysis", "spec", "plan"},
    "engine": {"sdk", "catalog", "analysis", "spec", "plan", "providers", "results"},
}

# Arrows that still point the wrong way, each for a reason; the test fails when one
# goes away (delete it here) as well as when a new one appears.
KNOWN: dict[tuple[str, str], str] = {
    # spec's up-front checks use the ssh provider's host parsing and remote.py's key
    # and address helpers, which wait for remote.py's split into smaller modules
    ("orchestrator.spec.values", "orchestrator.providers"):
        "the provider registry's names (tests register providers there)",
    ("orchestrator.spec.values", "orchestrator.providers.ssh"): "--host parsed as ssh.py does",
    ("orchestrator.spec.validate", "orchestrator.providers.base"):
        "ProviderOptions for SshProvider",
    ("orchestrator.spec.validate", "orchestrator.providers.ssh"): "--hosts checked by SshProvider",
    ("orchestrator.spec.validate", "orchestrator.providers.remote"): "an SSH key's public line",
    ("orchestrator.spec.environment", "orchestrator.providers.remote"):
        "CLOUDPROF_SSH_* values parsed as remote.py parses them",
    ("orchestrator.spec.environment", "orchestrator.providers.ssh"):
        "CLOUDPROF_SSH_USER checked by the ssh provider's rule",
    ("orchestrator.spec.validate", "orchestrator.plan.planner"):
        "--grid values whose trial ids clash, found by the planner's own trial_id",
    ("orchestrator.spec.config", "orchestrator.results.store"):
        "--resume reads the spec recorded in the store's sweep.json",
    # the planner labels each VM request with the sweep label of providers.base
    ("orchestrator.plan.planner", "orchestrator.providers.base"): "LABEL_SWEEP",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str) -> set[str]:
    """Every orchestrator module ``path`` (module ``name``) imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    modules = {m for m in found if m.split(".")[0] == "orchestrator"}
    return {m for m in modules if _is_module(m)}


def _is_module(name: str) -> bool:
    path = ROOT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _stage(module: str) -> str:
    """The package a module belongs to: ``engine`` for orchestrator.engine.sweep."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "orchestrator"


def import_graph() -> dict[str, set[str]]:
    """module -> the orchestrator modules it imports."""
    return {_module_name(p): _imports(p, _module_name(p)) for p in sorted(ROOT.rglob("*.py"))}


def wrong_way(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every (importer, imported) pair that breaks the layer rules."""
    bad = set()
    for module, targets in graph.items():
        src = _stage(module)
        for target in targets:
            dst = _stage(target)
            if dst in (src, "orchestrator") or dst in FOUNDATION or src in TOP:
                continue
            if src in FOUNDATION or dst in TOP or dst not in ALLOWED.get(src, set()):
                bad.add((module, target))
    return bad


def test_every_package_has_a_rule() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    # the top (the cli package) may import every stage, so it needs no line
    assert packages - TOP == set(ALLOWED), "a new package needs its line in ALLOWED"
    modules = {p.stem for p in ROOT.glob("*.py")} - {"__init__"}
    assert modules <= FOUNDATION | TOP, "a new top-level module is foundation or top"


def test_the_foundation_imports_no_stage() -> None:
    graph = import_graph()
    for name in FOUNDATION:
        stages = {_stage(t) for t in graph[f"orchestrator.{name}"]} - FOUNDATION
        assert stages <= {"orchestrator"}, f"orchestrator.{name} imports {sorted(stages)}"


def test_imports_between_stages_point_down() -> None:
    bad = wrong_way(import_graph())
    new = sorted(bad - set(KNOWN))
    assert not new, "imports against the layers:\n" + "\n".join(f"{a} -> {b}" for a, b in new)
    gone = sorted(set(KNOWN) - bad)
    assert not gone, "fixed, so delete from KNOWN: " + ", ".join(f"{a} -> {b}" for a, b in gone)


def test_the_check_sees_function_local_imports(tmp_path: Path) -> None:
    """A lazy import inside a function body is an arrow too, relative ones included."""
    source = tmp_path / "demo.py"
    source.write_text("import json\n\n\ndef f():\n    from orchestrator.engine import jobs\n"
                      "    from ..results import store\n    return jobs, store, json\n")
    found = _imports(source, "orchestrator.spec.demo")
    assert found == {"orchestrator.engine", "orchestrator.engine.jobs",
                     "orchestrator.results", "orchestrator.results.store"}
    assert wrong_way({"orchestrator.spec.demo": found}) == {
        ("orchestrator.spec.demo", t) for t in found}
    assert not wrong_way({"orchestrator.engine.demo": {"orchestrator.spec.spec"}})


if __name__ == "__main__":  # python tests/test_layers.py: the stage graph, arrows counted
    import collections

    arrows: collections.Counter[tuple[str, str]] = collections.Counter(
        (_stage(m), _stage(t)) for m, ts in import_graph().items() for t in ts
        if _stage(t) not in (_stage(m), "orchestrator") and _stage(t) not in FOUNDATION)
    for (src, dst), count in sorted(arrows.items()):
        print(f"{src:>10} -> {dst:<10} {count:3d}")
