"""The package's import graph, read with ``ast`` (nothing is imported): no circles.

Module-level imports are the statements that run when a module is imported: top-level
ones, and those inside top-level ``if`` / ``try`` / ``with`` / class bodies, but not under
``if TYPE_CHECKING``. Function-level imports (those in function bodies) run later and
may close a circle Python tolerates; they are read where a check needs them.

Checked: (a) no circle between modules at module level; (b) no circle between the
package's first-level subpackages (and modules: ``ops``, ``worker``, ``envs`` ...) at
module level; (c) ``vllm_ascend_ext.ops`` is a leaf: it imports nothing of the package
but ``errors`` and ``envs``, at module level or in functions (contract mode and the
emulated NPU runtime install themselves into the dispatch, the layers declare their
entry ops to the op counter); (d) no circle inside ``attention/sfa``, function-level
imports included. ``python tests/ut/suite/test_import_graph.py [--functions]`` prints the
circles between subpackages (``--functions``: function-level imports included).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

PACKAGE = "vllm_ascend_ext"
ROOT = Path(__file__).resolve().parents[3]

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported."""
    def walk(body: Iterable[ast.stmt]):
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    yield from walk(node.body)
                yield from walk(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, *(h.body for h in node.handlers), node.orelse,
                              node.finalbody):
                    yield from walk(block)
            elif isinstance(node, (ast.With, ast.ClassDef)):
                yield from walk(node.body)
    return walk(tree.body)


def all_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, function bodies and ``TYPE_CHECKING`` blocks included."""
    return (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


def _targets(module: str, is_package: bool, node, modules: set[str]) -> set[str]:
    """The package's modules an import statement loads (``from a import b``: ``a.b`` when
    that is a module, else ``a``), with the packages above them (their ``__init__``)."""
    if isinstance(node, ast.Import):
        names = {alias.name for alias in node.names}
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        names = {f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source
                 for a in node.names}
    out = set()
    for name in names:
        while name not in modules and "." in name:      # an attribute, not a module
            name = name.rsplit(".", 1)[0]
        if name in modules:
            parts = name.split(".")
            out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    own = module.split(".")
    ancestors = {".".join(own[:i]) for i in range(1, len(own) + 1)}
    return out - ancestors           # a module's own packages are loaded before it runs


def import_graph(sources: dict[str, tuple[str, bool]], *, function_level: bool = False) -> Graph:
    """``{module: (source text, is a package)}`` -> ``{module: modules it imports}``."""
    modules = set(sources)
    read = all_imports if function_level else module_level_imports
    return {name: set().union(*(_targets(name, is_pkg, n, modules) for n in read(ast.parse(text))))
            for name, (text, is_pkg) in sources.items()}


def package_sources(root: Path = ROOT) -> dict[str, tuple[str, bool]]:
    return {module_name(p, root): (p.read_text(), p.name == "__init__.py")
            for p in sorted((root / PACKAGE).rglob("*.py"))}


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative),
    plus nodes importing themselves: every circle lies in one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return found


def subpackage_graph(graph: Graph, depth: int = 2) -> dict[str, set[tuple[str, str]]]:
    """``{(subpackage, subpackage): the module edges between them}``, e.g. ops -> worker."""
    def sub(m: str) -> str:
        return ".".join(m.split(".")[:depth])
    edges: dict[str, set[tuple[str, str]]] = {}
    for module, targets in graph.items():
        for target in targets:
            if sub(module) != sub(target):
                edges.setdefault((sub(module), sub(target)), set()).add((module, target))
    return edges


def subpackage_cycles(graph: Graph) -> list[list[str]]:
    """The circles between first-level subpackages (``p.ops``, ``p.worker``, ``p.envs``)."""
    sub = subpackage_graph(graph)
    return cycles({a: {b for (x, b) in sub if x == a} for (a, _) in sub})


# -- the checks -------------------------------------------------------------------------

def test_no_circle_between_modules_at_module_level():
    graph = import_graph(package_sources())
    assert len(graph) > 100 and graph["vllm_ascend_ext.ops.fia"]   # the package was read
    assert cycles(graph) == []


def edges_between(graph: Graph, source: str, target: str) -> set[tuple[str, str]]:
    """The edges from package ``source`` (or its modules) to package ``target``."""
    def within(m: str, package: str) -> bool:
        return m == package or m.startswith(f"{package}.")
    return {(m, t) for m, targets in graph.items() for t in targets
            if within(m, source) and within(t, target)}


def test_no_circle_between_subpackages_at_module_level():
    graph = import_graph(package_sources())
    sub = subpackage_graph(graph)
    assert (f"{PACKAGE}.worker", f"{PACKAGE}.ops") in sub      # the graph was read
    assert subpackage_cycles(graph) == []


LEAF_DEPENDENCIES = {f"{PACKAGE}.errors", f"{PACKAGE}.envs"}


def test_ops_is_a_leaf_even_in_functions():
    """The operators import nothing of the package but ``errors`` and ``envs``: not the
    worker (the emulated runtime installs its graph recorder's kernel wrapper into the
    dispatch), not the layers (they declare their entry ops where they register them)."""
    graph = import_graph(package_sources(), function_level=True)
    ops = f"{PACKAGE}.ops"
    outside = {t for m, targets in graph.items() if m == ops or m.startswith(f"{ops}.")
               for t in targets if t != ops and not t.startswith(f"{ops}.")}
    assert outside <= LEAF_DEPENDENCIES, sorted(outside - LEAF_DEPENDENCIES)


def test_ops_import_nothing_of_the_contract_even_in_functions():
    graph = import_graph(package_sources(), function_level=True)
    assert edges_between(graph, f"{PACKAGE}.ops", f"{PACKAGE}.contract") == set()
    # the contract does import the operators (their registry): the edge runs one way
    assert f"{PACKAGE}.ops.registry" in graph[f"{PACKAGE}.contract.harness"]


def test_no_circle_inside_the_sfa_package_function_level_imports_included():
    prefix = f"{PACKAGE}.attention.sfa"
    graph = import_graph(package_sources(), function_level=True)
    sfa = {m: {t for t in targets if t.startswith(prefix)}
           for m, targets in graph.items() if m.startswith(prefix)}
    assert len(sfa) >= 10
    assert f"{prefix}.backend" not in sfa[f"{prefix}.caches"]
    assert cycles(sfa) == []


# -- negative controls: the reader and the circle finder find what they should ------------

def test_the_circle_finder_finds_circles_in_a_small_graph():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"b", "c"}}) == []
    two = cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c", "a"}})
    assert sorted(two) == [["a", "b"], ["c", "d", "e"]]


def test_the_subpackage_circle_finder_finds_a_circle_through_modules():
    sources = {"p": ("", True), "p.ops": ("", True), "p.worker": ("", True),
               "p.errors": ("", False),
               "p.ops.d": ("from p.worker import g\nfrom p import errors\n", False),
               "p.worker.g": ("from p.ops import counting\n", False),
               "p.ops.counting": ("from p.errors import E\n", False)}
    graph = import_graph(sources)
    assert subpackage_cycles(graph) == [["p.ops", "p.worker"]]
    del sources["p.ops.d"]
    assert subpackage_cycles(import_graph(sources)) == []


def test_an_ops_to_contract_import_in_a_function_would_be_found():
    sources = {"p": ("", True), "p.ops": ("", True), "p.contract": ("", True),
               "p.contract.mode": ("", False),
               "p.ops.d": ("def f():\n    from p.contract import mode\n", False)}
    graph = import_graph(sources, function_level=True)
    assert edges_between(graph, "p.ops", "p.contract") == {("p.ops.d", "p.contract"),
                                                           ("p.ops.d", "p.contract.mode")}
    assert edges_between(import_graph(sources), "p.ops", "p.contract") == set()


def test_the_reader_sees_module_level_and_function_level_imports_apart():
    sources = {
        "p": ("", True),
        "p.a": ("from typing import TYPE_CHECKING\nfrom p import b\n"
                "if TYPE_CHECKING:\n    from p.c import X\n"
                "def f():\n    from . import c\n", False),
        "p.b": ("try:\n    from .a import thing\nexcept ImportError:\n    pass\n", False),
        "p.c": ("import p.a\n", False),
    }
    module_level = import_graph(sources)
    assert module_level == {"p": set(), "p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}
    assert cycles(module_level) == [["p.a", "p.b"]]
    everything = import_graph(sources, function_level=True)
    assert everything["p.a"] == {"p.b", "p.c"}
    assert cycles(everything) == [["p.a", "p.b", "p.c"]]


if __name__ == "__main__":
    import sys

    read = import_graph(package_sources(), function_level="--functions" in sys.argv)
    sub = subpackage_graph(read)
    circles = subpackage_cycles(read)
    if not circles:
        print("no circle between subpackages")
    for circle in circles:
        print("circle between subpackages:", " ".join(circle))
        for (a, b), edges in sorted(sub.items()):
            if a in circle and b in circle:
                for m, t in sorted(edges):
                    if t != b:              # the package itself: implied by its module's edge
                        print(f"  {m} -> {t}")
