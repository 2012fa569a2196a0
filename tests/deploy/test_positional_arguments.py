"""No call passes more than 5 arguments by position: past that, two of them can trade places
and still type-check (the loss took 16 by position, `delta_low` and `delta_high` among them).

Read from the source with `ast` (api, workers, core, pdppo, bench, tests). A call counts the
positional arguments it binds to named parameters: where every definition of the called name in
the project takes the rest as `*args` (a command's words, a list of requests), those are items of
a list, not settings. A call of a name the project does not define is a library's: it is
allowed only when listed in `LIBRARY`, with the reason that library takes positions only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("api", "workers", "core", "pdppo", "bench", "tests")
MOST = 5

LIBRARY: dict[str, str] = {
    "apply": "torch.autograd.Function.apply takes the forward's inputs by position only",
    "save_for_backward": "torch's ctx.save_for_backward(*tensors) takes tensors by position only",
    "warning": "logging's %-style arguments, formatted only when the record is emitted",
}
"""Library calls that take more than 5 positional arguments, by the called name."""

TABLES: dict[str, str] = {
    "Row": "tests/store/transitions.py: a truth table of job states x requests, one row per "
    "line under `# fmt: off`, its 7 columns named once by the NamedTuple",
}
"""Project records written as tables: a row per line, the columns named by the record's class."""


@dataclass(frozen=True)
class Call:
    path: str
    line: int
    name: str
    positional: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name}(...) passes {self.positional} by position"


def sources(root: Path, trees: Iterable[str] = TREES) -> Iterator[tuple[str, ast.Module]]:
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            yield str(path.relative_to(root)), ast.parse(path.read_text(), str(path))


def _named_positional(node: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int | None:
    """How many positional arguments the definition binds to names; None when it has no
    `*args` (then every positional argument binds to a name, or fails)."""
    if node.args.vararg is None:
        return None
    named = len(node.args.posonlyargs) + len(node.args.args)
    return named - 1 if method else named


def definitions(modules: list[tuple[str, ast.Module]]) -> dict[str, list[int | None]]:
    """Each function, method and class name the project defines: for each definition, how many
    positional arguments it binds to names (None: all of them)."""
    found: dict[str, list[int | None]] = {}

    def visit(node: ast.AST, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                found.setdefault(child.name, []).append(_named_positional(child, in_class))
                visit(child, False)
            elif isinstance(child, ast.ClassDef):
                init = next(
                    (
                        n
                        for n in child.body
                        if isinstance(n, ast.FunctionDef) and n.name == "__init__"
                    ),
                    None,
                )
                binds = None if init is None else _named_positional(init, True)
                found.setdefault(child.name, []).append(binds)
                visit(child, True)
            else:
                visit(child, in_class)

    for _, module in modules:
        visit(module, False)
    return found


def _called(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def long_calls(root: Path, trees: Iterable[str] = TREES) -> list[Call]:
    """Calls that bind more than `MOST` positional arguments to parameters, not excused."""
    modules = list(sources(root, trees))
    defined = definitions(modules)
    found = []
    for path, module in modules:
        for node in ast.walk(module):
            if not isinstance(node, ast.Call):
                continue
            count = sum(1 for a in node.args if not isinstance(a, ast.Starred))
            name = _called(node.func)
            if count <= MOST or name is None or name in LIBRARY or name in TABLES:
                continue
            binds = [count if n is None else min(count, n) for n in defined.get(name, [None])]
            if min(binds) > MOST:
                found.append(Call(path, node.lineno, name, min(binds)))
    return found


def test_no_call_passes_more_than_five_arguments_by_position() -> None:
    calls = long_calls(ROOT)
    assert [str(c) for c in calls] == []


def test_a_long_call_is_found_and_named(tmp_path: Path) -> None:
    """A project function called with 6 by position is named; 5, keywords past 5, a
    `*args` function's items and a listed library call are not."""
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "loss.py").write_text(
        "import torch\n\n\n"
        "def loss(a, b, c, d, e, f=0.0):\n    return a\n\n\n"
        "def run(cmd, *words):\n    return cmd\n\n\n"
        "class Fn(torch.autograd.Function):\n    pass\n\n\n"
        "loss(1, 2, 3, 4, 5, 6)\n"
        "loss(1, 2, 3, 4, 5, f=6)\n"
        "run('docker', 'compose', 'up', '-d', 'redis', 'api', 'worker')\n"
        "Fn.apply(1, 2, 3, 4, 5, 6, 7)\n"
        "torch.nonexistent(1, 2, 3, 4, 5, 6)\n"
    )
    calls = long_calls(tmp_path, ("core",))
    assert [str(c) for c in calls] == [
        "core/loss.py:16 loss(...) passes 6 by position",
        "core/loss.py:20 nonexistent(...) passes 6 by position",
    ]


def test_every_excused_name_still_has_a_call() -> None:
    """An excuse no call needs any more is removed, not kept for a call that may come back."""
    used = {
        _called(node.func)
        for _, module in sources(ROOT)
        for node in ast.walk(module)
        if isinstance(node, ast.Call) and len(node.args) > MOST
    }
    assert sorted(set(LIBRARY) | set(TABLES)) == sorted(used & (set(LIBRARY) | set(TABLES)))
