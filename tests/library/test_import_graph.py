"""The library's import graph (issue 34, item 2): plugins/memwal outside memwal.airflow draws with no circle
and no arrow up into memwal.airflow or spark_jobs. Every import counts, module-level or inside a function
(a lazy import is still a dependency), except those under `if TYPE_CHECKING:`; and no module imports another's
private name. What cannot be cut yet is listed below with its reason. Run this file alone to see the graph's
circles: `.venv/bin/python -m pytest tests/library/test_import_graph.py -q`."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "plugins" / "memwal"
UPPER = ("memwal.airflow", "spark_jobs")  # the layers above the library
GENERATED = ("memwal._proto",)

# Circles that cannot be cut yet, each with its reason; empty is the goal. A circle here that no longer exists
# fails the test too, so the list only shrinks.
KNOWN_CIRCLES: dict[frozenset[str], str] = {}

# Arrows up that cannot be cut yet, each with its reason (the same rule: the list only shrinks).
KNOWN_UPWARD: dict[str, str] = {}

# Private names imported from another module (`from memwal.x import _y`), each with its reason.
KNOWN_PRIVATE_IMPORTS: dict[str, str] = {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _spark_modules() -> set[str]:
    return {f"spark_jobs.{p.stem}" for p in (REPO / "spark_jobs").glob("*.py")} | {"spark_jobs"}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of memwal and spark_jobs that `module` imports (a name imported from a package is the
    submodule of that name when there is one, else the package)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def target(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("memwal", "spark_jobs"):
                    found.add(target(alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] in ("memwal", "spark_jobs"):
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    found.add(sub if sub in known else target(source))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(None)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the memwal and spark_jobs modules it imports, for every module of plugins/memwal."""
    modules = _modules()
    known = set(modules) | _spark_modules()
    graph = {}
    for name, path in modules.items():
        if name.startswith(GENERATED):
            continue
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {m for m in _imports(tree, name, path.name == "__init__.py", known)
                       if not m.startswith(GENERATED)}
    return graph


def _is_library(module: str) -> bool:
    return not module.startswith(UPPER)


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def library_graph() -> dict[str, set[str]]:
    graph = import_graph()
    return {m: {t for t in targets if _is_library(t)} for m, targets in graph.items() if _is_library(m)}


def test_the_graph_sees_the_imports_it_must_see():
    """Control: the parser finds a module-level import, a relative one and a lazy one inside a function."""
    tree = ast.parse("from memwal.storage import ObjectStore\nfrom . import naming\n"
                     "def f():\n    import memwal.wal\n    from spark_jobs import common\n")
    known = {"memwal", "memwal.storage", "memwal.naming", "memwal.wal", "memwal.merge", "spark_jobs",
             "spark_jobs.common"}
    assert _imports(tree, "memwal.merge", False, known) == {
        "memwal.storage", "memwal.naming", "memwal.wal", "spark_jobs.common"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_the_library_imports_nothing_above_it():
    graph = import_graph()
    upward = {f"{m} -> {t}" for m, targets in graph.items() if _is_library(m) for t in targets if not _is_library(t)}
    new = sorted(upward - set(KNOWN_UPWARD))
    assert new == [], f"the library (plugins/memwal outside memwal.airflow) imports Airflow's or Spark's layer: {new}"
    gone = sorted(set(KNOWN_UPWARD) - upward)
    assert gone == [], f"these known arrows are gone: remove them from KNOWN_UPWARD: {gone}"


def private_imports() -> set[str]:
    """`importer <- source.name` for every `from memwal... / spark_jobs... import _name` of plugins/memwal and
    spark_jobs (a module's private name is its own to change)."""
    found = set()
    for root in (PACKAGE, REPO / "spark_jobs"):
        for path in sorted(root.rglob("*.py")):
            importer = _module_name(path) if root == PACKAGE else f"spark_jobs.{path.stem}"
            if importer.startswith(GENERATED):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("memwal", "spark_jobs"):
                    found.update(f"{importer} <- {node.module}.{a.name}" for a in node.names
                                 if a.name.startswith("_") and not a.name.startswith("__"))
    return found


def test_no_private_name_is_imported_across_modules():
    found = private_imports()
    new = sorted(found - set(KNOWN_PRIVATE_IMPORTS))
    assert new == [], f"private names imported from another module (make them public or move the code): {new}"
    gone = sorted(set(KNOWN_PRIVATE_IMPORTS) - found)
    assert gone == [], f"these known private imports are gone: remove them from KNOWN_PRIVATE_IMPORTS: {gone}"


def test_the_library_has_no_import_circle():
    found = set(circles(library_graph()))
    new = sorted(sorted(c) for c in found - set(KNOWN_CIRCLES))
    assert new == [], f"import circles in the library: {new}"
    gone = sorted(sorted(c) for c in set(KNOWN_CIRCLES) - found)
    assert gone == [], f"these known circles are gone: remove them from KNOWN_CIRCLES: {gone}"
