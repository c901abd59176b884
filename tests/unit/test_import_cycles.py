"""No import cycle under src/tandem: between modules, and between sibling packages.

Modules: every import counts, wherever it is written (at the top, under ``TYPE_CHECKING``,
inside a function) and whatever it names (a module of an enclosing package included); an
import names the deepest module it reaches (``from tandem.a import b`` is ``tandem.a.b``
when that is a module, else ``tandem.a``'s ``__init__``). A cycle there means two files'
types or helpers sit in the wrong place.

Packages: a package is a directory and the modules directly in it belong to it. An import
of a module in an enclosing package (``tandem.gateway.pd`` using ``tandem.gateway.metrics``)
is how a package reaches shared pieces and does not count at this level (the module graph
checks it); every other edge between packages does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tandem

ROOT = Path(tandem.__file__).parent  # src/tandem


def _package_of(dotted: str) -> str | None:
    """The package (directory, dotted) that holds module or package ``dotted``."""
    parts = dotted.split(".")
    if parts[0] != "tandem":
        return None
    path = ROOT.joinpath(*parts[1:])
    if path.is_dir():
        return dotted
    if path.with_suffix(".py").is_file():
        return ".".join(parts[:-1])
    return None


def _imports(module: str, tree: ast.AST, is_package: bool) -> set[str]:
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets.add(stem)
            targets.update(f"{stem}.{alias.name}" for alias in node.names)
    return targets


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module's dotted name → (its file, whether it is a package's ``__init__``)."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        is_package = rel.name == "__init__"
        found[".".join(rel.parts[:-1] if is_package else rel.parts)] = (path, is_package)
    return found


def module_graph() -> dict[str, set[str]]:
    modules = _modules()

    def deepest(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        edges = graph.setdefault(module, set())
        for target in _imports(module, ast.parse(path.read_text()), is_package):
            reached = deepest(target)
            if reached is not None and reached != module:
                edges.add(reached)
    return graph


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        is_package = rel.name == "__init__"
        module = ".".join(rel.parts[:-1] if is_package else rel.parts)
        own = module if is_package else ".".join(rel.parts[:-1])
        edges = graph.setdefault(own, set())
        for target in _imports(module, ast.parse(path.read_text()), is_package):
            other = _package_of(target)
            if other is None or other == own or own.startswith(other + "."):
                continue  # outside tandem, the same package, or an enclosing one
            edges.add(other)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            cycle = visit(nxt)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start)
        if cycle:
            return cycle
    return None


def test_no_import_cycle_between_packages() -> None:
    graph = package_graph()
    assert "tandem.gateway.pd" in graph and "tandem.gateway.dispatch" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "packages import each other: " + " -> ".join(cycle or [])


def test_no_import_cycle_between_modules() -> None:
    graph = module_graph()
    # The graph sees the edges this file is about: a parent-package module, a function-level
    # import and a TYPE_CHECKING one.
    assert "tandem.gateway.metrics" in graph["tandem.gateway.backends.vllm.pd_sequential"]
    assert "tandem.engine.structured" in graph["tandem.engine.request"]  # TYPE_CHECKING
    cycle = find_cycle(graph)
    assert cycle is None, "modules import each other: " + " -> ".join(cycle or [])


def test_the_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
