"""No import cycle between fabricmon's modules, and no private reach across the stream modules.

Imports are read with ``ast`` (nothing is imported): every import at module level, including
those under ``if TYPE_CHECKING:`` (a type-only cycle is still two modules that cannot be
understood apart).  Imports inside a function body are left out: they are deliberate lazy
imports (optional dependencies, start-up cost) and run after both modules are loaded.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from support.paths import REPO

PACKAGE = REPO / "fabricmon"


def _modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imports(tree: ast.Module, lazy: bool):
    """Import nodes outside function bodies (and inside them too with ``lazy``)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            if lazy or not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack.append(child)


def import_graph(package: Path, lazy: bool = False) -> dict[str, set[str]]:
    top = package.name
    mods = _modules(package)
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        deps: set[str] = set()
        for node in _imports(_parse(path), lazy):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.split(".")[0] == top)
                continue
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != top:
                continue
            for alias in node.names:  # ``from pkg import module`` imports that module
                deps.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in mods else target)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_import_cycle_in_fabricmon():
    graph = import_graph(PACKAGE)
    assert len(graph) > 100 and graph["fabricmon.agent.stream"], "the scan found the package's modules"
    assert cycles(graph) == []


def test_detector_finds_a_cycle_including_type_checking_imports(tmp_path):
    pkg = tmp_path / "fabricmon"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from .b import B\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    (pkg / "c.py").write_text("def f():\n    from .d import x\n")  # lazy: not a cycle
    (pkg / "d.py").write_text("from fabricmon import c\n")
    assert cycles(import_graph(pkg)) == [["fabricmon.sub.a", "fabricmon.sub.b"]]


STREAM_MODULES = ("stream.py", "stream_session.py", "stream_state.py", "stream_batches.py", "stream_channel.py",
                  "stream_replay.py")


def private_reaches(source: str) -> list[str]:
    """``x._name`` where ``x`` is not ``self`` or ``cls``: one object's private parts used by another."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            out.append(f"line {node.lineno}: .{node.attr}")
    return out


def test_stream_modules_use_each_other_through_public_names():
    assert private_reaches("class A:\n    def f(self, c):\n        return c._inq, self._ok\n") == ["line 3: ._inq"]
    found = {name: private_reaches((PACKAGE / "agent" / name).read_text()) for name in STREAM_MODULES}
    assert {name: reaches for name, reaches in found.items() if reaches} == {}


def test_modules_below_sources_never_import_sources():
    """sources/ builds on a few core modules (config, model, bounds of text, ...); none of those
    may import from sources/, not even lazily, or the two layers could not be read apart."""
    graph = import_graph(PACKAGE)
    lazy = import_graph(PACKAGE, lazy=True)
    below: set[str] = set()
    todo = [m for m in graph if m.startswith("fabricmon.sources")]
    while todo:
        for dep in graph[todo.pop()]:
            if not dep.startswith("fabricmon.sources") and dep not in below:
                below.add(dep)
                todo.append(dep)
    assert "fabricmon.config" in below and "fabricmon.model" in below
    upward = {m: sorted(d for d in lazy[m] if d.startswith("fabricmon.sources")) for m in below}
    assert {m: deps for m, deps in upward.items() if deps} == {}


def test_the_simulator_never_imports_the_demo():
    lazy = import_graph(PACKAGE, lazy=True)
    assert lazy["fabricmon.sim.drive"], "the scan found the simulator's imports"
    found = {m: sorted(d for d in deps if d.startswith("fabricmon.demo"))
             for m, deps in lazy.items() if m.startswith("fabricmon.sim")}
    assert {m: deps for m, deps in found.items() if deps} == {}


def test_no_aggregator_import_circle_counting_lazy_imports():
    lazy = import_graph(PACKAGE, lazy=True)
    agg = {m: {d for d in deps if d.startswith("fabricmon.aggregator")}
           for m, deps in lazy.items() if m.startswith("fabricmon.aggregator")}
    assert "fabricmon.aggregator.credentials" in agg["fabricmon.aggregator.config"]
    assert cycles(agg) == []
