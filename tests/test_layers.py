"""Imports run downward only: no module of milo_ray imports from a layer above its own
(``milo_ray.core.layers.LAYERS``), and no import closes a cycle. Every import statement
counts, top level and inside functions; type-only imports (``if TYPE_CHECKING:``) may
point upward but still may not close a cycle."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import milo_ray
from milo_ray.core.layers import LAYERS, NOT_CODE

PACKAGE = Path(milo_ray.__file__).parent


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (a package's __init__ named by the package)
    path: Path
    line: int
    type_only: bool


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if not any(name == n or name.startswith(n + ".") for n in NOT_CODE):
            out[name] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(node: ast.AST, type_only: bool = False):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, type_only
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _statements(ast.Module(body=[stmt], type_ignores=[]), True)
            for stmt in child.orelse:
                yield from _statements(ast.Module(body=[stmt], type_ignores=[]), type_only)
        else:
            yield from _statements(child, type_only)


def _known(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports(mods: dict[str, Path]) -> list[Import]:
    found = []
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for stmt, type_only in _statements(ast.parse(path.read_text(), str(path))):
            if isinstance(stmt, ast.Import):
                targets = [a.name for a in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:
                    parts = name.split(".")
                    keep = len(parts) - stmt.level + (1 if is_pkg else 0)
                    base = ".".join(parts[:keep] + ([base] if base else []))
                # `from pkg import sub` imports the submodule; `from mod import name` the module.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in stmt.names]
            for target in targets:
                if target.split(".")[0] != "milo_ray":
                    continue
                resolved = _known(target, mods)
                if resolved and resolved != name:
                    found.append(Import(name, resolved, path, stmt.lineno, type_only))
    return found


def layer_of(module: str) -> int | None:
    """Index into LAYERS of the longest unit naming ``module`` or a package above it."""
    best, best_len = None, -1
    for i, layer in enumerate(LAYERS):
        for unit in layer.units:
            hit = module == unit or (unit != "milo_ray" and module.startswith(unit + "."))
            if hit and len(unit) > best_len:
                best, best_len = i, len(unit)
    return best


def upward_imports(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        if imp.type_only:
            continue
        low, high = layer_of(imp.source), layer_of(imp.target)
        if high is not None and low is not None and high > low:
            bad.append(f"{imp.path.relative_to(PACKAGE.parent)}:{imp.line}: {imp.source} (layer "
                       f"{LAYERS[low].name!r}) imports {imp.target} (layer {LAYERS[high].name!r}, above it)")
    return bad


def cycles(found: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on_stack.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on_stack:
                low[v] = min(low[v], index[w])
    return out


def _cycle_lines(comp: list[str], found: list[Import]) -> str:
    members = set(comp)
    edges = [f"  {imp.path.relative_to(PACKAGE.parent)}:{imp.line}: {imp.source} -> {imp.target}"
             for imp in found if imp.source in members and imp.target in members]
    return "cycle among " + ", ".join(comp) + ":\n" + "\n".join(edges)


MODULES = modules()
FOUND = imports(MODULES)


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if layer_of(m) is None)
    assert not missing, f"modules no row of milo_ray.core.layers.LAYERS names: {missing}"


def test_no_module_imports_from_a_layer_above_it():
    bad = upward_imports(FOUND)
    assert not bad, "imports against the layer table (milo_ray/core/layers.py):\n" + "\n".join(bad)


def test_no_import_cycle():
    found = cycles(FOUND)
    assert not found, "\n".join(_cycle_lines(c, FOUND) for c in found)


def test_the_checks_see_function_local_and_type_only_imports():
    # The scan itself: a function-local upward import and a cycle through one are caught,
    # an upward import under TYPE_CHECKING is not an offence.
    src = {"milo_ray/core/x.py": "def f():\n    from milo_ray.run import main\n",
           "milo_ray/run.py": "from milo_ray.core import x\n",
           "milo_ray/store/y.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from milo_ray.run import main\n"}
    mods = {"milo_ray.core.x": Path("milo_ray/core/x.py"), "milo_ray.run": Path("milo_ray/run.py"),
            "milo_ray.store.y": Path("milo_ray/store/y.py")}
    found = []
    for name, path in mods.items():
        tree = ast.parse(src[str(path)])
        for stmt, type_only in _statements(tree):
            for a in stmt.names if isinstance(stmt, ast.ImportFrom) else []:
                target = f"{stmt.module}.{a.name}" if f"{stmt.module}.{a.name}" in mods else stmt.module
                found.append(Import(name, target, PACKAGE.parent / path, stmt.lineno, type_only))
    assert [b.split(": ")[0] for b in upward_imports(found)] == ["milo_ray/core/x.py:2"]
    assert cycles(found) == [["milo_ray.core.x", "milo_ray.run"]]
