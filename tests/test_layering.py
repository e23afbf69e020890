"""The package reads in pipeline order: no module imports from a later stage, and no two
modules import each other, directly or around a circle (imports inside functions count).

Stages: base (errors, options, the planner graph, helpers, the cost op, the reference
models) < importer < op_semantics < search < rewrite < runtime < api < tools < binaries."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "tofu_tf"

STAGES = ["base", "importer", "op_semantics", "search", "rewrite", "runtime", "api", "tools",
          "binaries"]
TOP_LEVEL = {"api": "api", "__init__": "api", "train": "binaries", "plan": "binaries",
             "_cli": "binaries"}
PACKAGES = {"importer", "op_semantics", "search", "rewrite", "runtime", "tools"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def stage(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "api"                                      # the package's __init__
    if parts[1] in PACKAGES:
        return parts[1]
    return TOP_LEVEL.get(parts[1], "base")


def imports() -> dict[str, set[str]]:
    """Module -> the tofu_tf modules it imports (a `from X import name` imports X.name
    where that is a module, else X)."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for module, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.split(".")[0] == "tofu_tf"}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] == "tofu_tf":
                names = [f"{node.module}.{a.name}" for a in node.names]
                inner = [n for n in names if n in modules]
                found |= set(inner) if len(inner) == len(names) else {node.module} | set(inner)
        out[module] = found - {module}
    return out


GRAPH = imports()


def test_the_graph_sees_the_stages():
    assert {stage(m) for m in GRAPH} == set(STAGES)
    assert len(GRAPH) > 80 and sum(map(len, GRAPH.values())) > 200


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m != "tofu_tf"))
def test_no_import_from_a_later_stage(module):
    here = STAGES.index(stage(module))
    later = sorted(t for t in GRAPH[module]
                   if t != "tofu_tf" and STAGES.index(stage(t)) > here)
    assert not later, f"{module} ({stage(module)}) imports from later stages: {later}"


def test_no_import_cycles():
    """Every strongly connected component of the import graph is one module."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(v):                                        # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in GRAPH or w == "tofu_tf":
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"
