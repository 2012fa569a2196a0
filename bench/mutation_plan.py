"""What `bench/mutation.py` mutates: its config, the mutants cosmic-ray generates for a module,
the reviewed equivalent mutants it subtracts, and the seeded sample CI runs.

Mutants come from cosmic-ray's own operators, positions and occurrence numbering, so that
`cosmic_ray.mutating.use_mutation` applies exactly the mutant listed here. Two cuts are ours:
only the operators named in `bench/mutation.toml` (one replacement per arithmetic operator, the
boundary and the negation of each comparison, instead of cosmic-ray's every-to-every
replacement: the rest are killed by any test that reaches them and only add run time), and
nothing inside a type annotation (not evaluated at run time under `from __future__ import
annotations`; where it is, a changed `X | None` fails at import and proves nothing), and no +-1
on a tuning constant: a module-level UPPER_CASE name bound to a number of magnitude 10 or more
(a page size, a buffer, a block time in ms), where one more or less changes nothing a test can
observe (under 10%); small constants (a lease of 2 s, 4 reads in flight) are still mutated.
Nor the bare `*` (or `/`) of a signature: cosmic-ray 8.7 takes the keyword-only marker for a
multiplication, and `def f(a, /, b)` accepts every call the code makes of `def f(a, *, b)`.
Nor a dotted exception name (`except (importlib.metadata.PackageNotFoundError, ...)`): cosmic-ray
8.7's ExceptionReplacer lists it and then fails applying it (AttributeError).
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import random
import re
import subprocess
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cosmic_ray.plugins
from cosmic_ray.ast import ast_nodes, get_ast_from_path
from cosmic_ray.mutating import mutate_code

from bench import mutation_lua

PROVIDER = "core"
"""cosmic-ray's operator provider; operator names in the config leave out its `core/` prefix."""
NUMBER_REPLACER = f"{PROVIDER}/NumberReplacer"
BINARY = f"{PROVIDER}/ReplaceBinaryOperator_"
SIGNATURES = {"parameters", "lambdef"}  # parso's parents of a bare `*` or `/` marker
CONSTANT_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
Position = tuple[int, int]


@dataclass(frozen=True)
class Group:
    """Modules that one set of tests guards, and those tests (fast files first)."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]
    quick_tests: tuple[str, ...]
    confirm_kills: bool
    lua: bool = False  # mutate the Lua bodies of its modules (`bench/mutation_lua.py`), not Python


@dataclass(frozen=True)
class Equivalent:
    """A mutant reviewed as equivalent: no test can tell it from the original, and why."""

    file: str
    line: int
    operator: str
    code: str
    mutant: str
    reason: str


@dataclass(frozen=True)
class EquivalentRule:
    """A kind of mutant reviewed once for many lines: every mutant of `operator` in `files`
    (globs) whose original line, with `@` inserted where the mutation starts, matches the regex
    `context`. For a reason that holds by construction of those modules (a shape they check on
    entry), where one entry per line would bury the reviewed ones that need a reason each."""

    name: str
    files: tuple[str, ...]
    operator: str
    context: str
    reason: str

    def matches(self, mutant: Mutant, line: str) -> bool:
        return (
            mutant.short_operator == self.operator
            and any(fnmatch.fnmatchcase(mutant.module, f) for f in self.files)
            and re.search(self.context, f"{line[: mutant.col]}@{line[mutant.col :]}") is not None
        )


@dataclass(frozen=True)
class Config:
    operators: tuple[str, ...]
    groups: tuple[Group, ...]
    equivalents: tuple[Equivalent, ...]
    rules: tuple[EquivalentRule, ...] = ()
    lua_operators: tuple[str, ...] = ()  # `[operators] lua`, for the groups with `lua = true`

    def group(self, name: str) -> Group:
        for group in self.groups:
            if group.name == name:
                return group
        names = ", ".join(g.name for g in self.groups)
        raise SystemExit(f"--modules: no group or module {name!r} (groups: {names})")

    def group_of(self, module: str) -> Group | None:
        """The group whose module patterns match a module path."""
        return next(
            (g for g in self.groups if any(fnmatch.fnmatchcase(module, p) for p in g.modules)),
            None,
        )


@dataclass(frozen=True)
class Mutant:
    """One mutation: cosmic-ray's (operator, occurrence) in a module, and the line it changes."""

    module: str
    operator: str
    occurrence: int
    line: int
    col: int
    code: str
    mutated: str = ""  # filled in when known: making it means parsing the module again
    anchors: tuple[int, ...] = ()  # the lines whose coverage says which tests reach it (`line`)
    foreign: tuple[tuple[str, int], ...] = ()  # (module, line): anchors in the group's others

    @property
    def short_operator(self) -> str:
        return self.operator.split("/", 1)[1]

    @property
    def key(self) -> str:
        return f"{self.module}:{self.line}:{self.col}:{self.short_operator}:{self.occurrence}"


def _strings(table: dict[str, Any], field: str, where: str) -> tuple[str, ...]:
    value = table.get(field, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SystemExit(f"bench/mutation.toml: {where}.{field} must be a list of strings")
    return tuple(value)


def load_config(path: Path) -> Config:
    raw = tomllib.loads(path.read_text())
    groups = []
    for index, table in enumerate(raw.get("group", [])):
        where = f"group[{index}]"
        if not isinstance(table.get("name"), str):
            raise SystemExit(f"{path}: {where}.name must be a string")
        tests = _strings(table, "tests", where)
        groups.append(
            Group(
                name=table["name"],
                modules=_strings(table, "modules", where),
                tests=tests,
                quick_tests=_strings(table, "quick_tests", where) or tests,
                confirm_kills=bool(table.get("confirm_kills", False)),
                lua=bool(table.get("lua", False)),
            )
        )
    equivalents = []
    for index, table in enumerate(raw.get("equivalent", [])):
        missing = {"file", "line", "operator", "code", "mutant", "reason"} - set(table)
        if missing:
            raise SystemExit(f"{path}: equivalent[{index}] lacks {', '.join(sorted(missing))}")
        equivalents.append(Equivalent(**{k: table[k] for k in Equivalent.__dataclass_fields__}))
    rules = []
    for index, table in enumerate(raw.get("equivalent_rule", [])):
        where = f"equivalent_rule[{index}]"
        missing = {"name", "files", "operator", "context", "reason"} - set(table)
        if missing:
            raise SystemExit(f"{path}: {where} lacks {', '.join(sorted(missing))}")
        try:
            re.compile(table["context"])
        except re.error as exc:
            raise SystemExit(f"{path}: {where}.context is not a regex: {exc}") from None
        rules.append(
            EquivalentRule(
                name=table["name"],
                files=_strings(table, "files", where),
                operator=table["operator"],
                context=table["context"],
                reason=table["reason"],
            )
        )
    operators = _strings(raw.get("operators", {}), "use", "operators")
    known = [name.split("/", 1)[1] for name in cosmic_ray.plugins.operator_names()]
    for pattern in operators:
        if not fnmatch.filter(known, pattern):
            raise SystemExit(f"{path}: operators.use: {pattern!r} matches no cosmic-ray operator")
    lua = _strings(raw.get("operators", {}), "lua", "operators")
    for pattern in lua:
        if not fnmatch.filter(list(mutation_lua.OPERATORS), pattern):
            raise SystemExit(f"{path}: operators.lua: {pattern!r} matches no Lua operator")
    return Config(
        operators=operators,
        groups=tuple(groups),
        equivalents=tuple(equivalents),
        rules=tuple(rules),
        lua_operators=lua,
    )


def operator_names(patterns: tuple[str, ...]) -> list[str]:
    """The full cosmic-ray names (`core/...`) the config's patterns select, in its order."""
    return [
        name
        for name in cosmic_ray.plugins.operator_names()
        if name.startswith(f"{PROVIDER}/")
        and not cosmic_ray.plugins.get_operator(name).arguments()
        and any(fnmatch.fnmatchcase(name.split("/", 1)[1], p) for p in patterns)
    ]


class _Positions:
    """Where, in parso's (line, column in characters), the mutants we leave out would start."""

    def __init__(self, source: str) -> None:
        self._lines = source.splitlines()
        tree = ast.parse(source)
        self.annotations: list[tuple[Position, Position]] = []
        for node in ast.walk(tree):
            found: list[ast.expr | None] = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append(node.returns)
            elif isinstance(node, ast.arg | ast.AnnAssign):
                found.append(node.annotation)
            for ann in found:
                if ann is not None:
                    self.annotations.append((self._start(ann), self._end(ann)))
        self.tuning: set[Position] = set()
        for stmt in tree.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else []
            if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                targets, value = [stmt.target], stmt.value
            elif isinstance(stmt, ast.Assign):
                value = stmt.value
            else:
                continue
            if all(isinstance(t, ast.Name) and CONSTANT_NAME.fullmatch(t.id) for t in targets):
                for node in ast.walk(value):
                    number = isinstance(node, ast.Constant) and type(node.value) in (int, float)
                    if number and abs(node.value) >= 10:  # type: ignore[attr-defined]
                        self.tuning.add(self._start(node))

    def _chars(self, line: int, byte_col: int) -> int:
        return len(self._lines[line - 1].encode()[:byte_col].decode(errors="replace"))

    def _start(self, node: ast.AST) -> Position:
        return node.lineno, self._chars(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def _end(self, node: ast.expr) -> Position:
        assert node.end_lineno is not None and node.end_col_offset is not None
        return node.end_lineno, self._chars(node.end_lineno, node.end_col_offset)

    def left_out(self, operator: str, start: Position, node: Any) -> str | None:
        if any(a <= start < b for a, b in self.annotations):
            return "in annotations"
        if operator == NUMBER_REPLACER and start in self.tuning:
            return "tuning constants"
        if operator.startswith(BINARY) and getattr(node.parent, "type", "") in SIGNATURES:
            return "signature markers"
        return None


def changed_text(original: str, mutated: str) -> str:
    """The mutated text of the lines a mutation changed, stripped ("/" between lines)."""
    before, after = original.splitlines(), mutated.splitlines()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(a=before, b=after).get_opcodes():
        if tag != "equal":
            return " / ".join(line.strip() for line in after[j1:j2]) or "<line removed>"
    return ""


def describe(root: Path, mutant: Mutant) -> Mutant:
    """`mutant` with its mutated line filled in, from the (unmutated) source under `root`."""
    if mutant.mutated:
        return mutant
    source = (root / mutant.module).read_text()
    if mutation_lua.is_lua(mutant.operator):
        mutated = mutation_lua.mutate_source(source, mutant.operator, mutant.occurrence)
    else:
        operator = cosmic_ray.plugins.get_operator(mutant.operator)()
        mutated = mutate_code(source, operator, mutant.occurrence)
    return replace(mutant, mutated=changed_text(source, mutated) if mutated else "<no mutation>")


def _dotted(node: Any, start: tuple[int, int], end: tuple[int, int]) -> bool:
    """Whether the exception name at `start`..`end` of an except clause is dotted
    (`except (a.Error, ...)`): cosmic-ray's ExceptionReplacer replaces a plain name only, and
    raises AttributeError applying it to a dotted one, which stopped the whole step."""
    leaf = node.get_leaf_for_position(start)
    if leaf.end_pos <= start:  # the position between two leaves gives the one before
        leaf = leaf.get_next_leaf()
    return bool(leaf.end_pos != end)


def generate(
    root: Path, module: str, patterns: tuple[str, ...]
) -> tuple[list[Mutant], dict[str, int]]:
    """Every mutant of `module` (relative to `root`) under the selected operators, and how many
    were left out, by reason (see the module's docstring)."""
    path = root / module
    source = path.read_text()
    where = _Positions(source)
    lines = source.splitlines()
    # one walk of the tree for every operator: the walk, once per operator, was most of the
    # time of planning a run of many modules
    nodes = list(ast_nodes(get_ast_from_path(path)))
    mutants: list[Mutant] = []
    left_out: dict[str, int] = {}
    for name in operator_names(patterns):
        operator = cosmic_ray.plugins.get_operator(name)()
        positions = [
            (node, start, end) for node in nodes for start, end in operator.mutation_positions(node)
        ]
        for occurrence, (node, start, end) in enumerate(positions):
            reason = where.left_out(name, start, node)
            if reason is None and name.endswith("/ExceptionReplacer") and _dotted(node, start, end):
                reason = "dotted exception names"
            if reason is not None:
                left_out[reason] = left_out.get(reason, 0) + 1
                continue
            code = lines[start[0] - 1].strip()
            mutants.append(
                Mutant(
                    module=module,
                    operator=name,
                    occurrence=occurrence,
                    line=start[0],
                    col=start[1],
                    code=code,
                )
            )
    mutants.sort(key=lambda m: (m.line, m.col, m.operator, m.occurrence))
    return mutants, left_out


def generate_lua(
    root: Path, module: str, patterns: tuple[str, ...], others: tuple[str, ...] = ()
) -> tuple[list[Mutant], dict[str, int]]:
    """Every mutant of the Lua bodies `module` embeds (`bench/mutation_lua.py`), under the Lua
    operators `patterns` select; none is left out here (subscripts are never sites). `others`:
    the group's other modules, whose calls of a script built from one of `module`'s bodies are
    the mutant's `foreign` anchors (`mutation_lua.calls_in`)."""
    source = (root / module).read_text()
    dotted = module.removesuffix(".py").replace("/", ".")
    importers = {o: (root / o).read_text() for o in others if o != module}
    found: dict[frozenset[str], tuple[tuple[str, int], ...]] = {}

    def foreign(line: int) -> tuple[tuple[str, int], ...]:
        names = mutation_lua.defining_names(source, line)
        if names not in found:
            found[names] = tuple(
                (other, at)
                for other, text in importers.items()
                for at in mutation_lua.calls_in(text, dotted, names)
            )
        return found[names]

    lines = source.splitlines()
    starts = [0]
    for text in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(text))
    mutants = []
    occurrences: dict[str, int] = {}
    for site in mutation_lua.sites(source, mutation_lua.short_names(patterns)):
        occurrence = occurrences.get(site.operator, 0)
        occurrences[site.operator] = occurrence + 1
        line = max(n for n, start in enumerate(starts, 1) if start <= site.start)
        col = site.start - starts[line - 1]
        code = lines[line - 1].strip()
        mutant = Mutant(
            module=module,
            operator=site.operator,
            occurrence=occurrence,
            line=line,
            col=col,
            code=code,
            anchors=site.anchors,
            foreign=foreign(line) if importers else (),
        )
        mutants.append(mutant)
    mutants.sort(key=lambda m: (m.line, m.col, m.operator, m.occurrence))
    return mutants, {}


def split_equivalents(
    root: Path,
    mutants: list[Mutant],
    equivalents: tuple[Equivalent, ...],
    rules: tuple[EquivalentRule, ...] = (),
) -> tuple[list[Mutant], list[tuple[Mutant, Equivalent]], list[Equivalent]]:
    """(mutants to run, (mutant, entry) pairs subtracted, entries that matched nothing).

    An entry matches by file, operator and the original and mutated text, so that it survives
    edits above it; its line picks among identical lines. A stale entry is printed, not ignored:
    the list must not quietly excuse a mutant it no longer describes. A mutant no entry matches
    is subtracted by the first rule it matches, under an entry made from the rule (its name in
    front of its reason)."""
    matched: dict[str, tuple[Mutant, Equivalent]] = {}
    stale = []
    for entry in equivalents:
        candidates = [
            described
            for m in mutants
            if m.module == entry.file
            and m.short_operator == entry.operator
            and m.code == entry.code.strip()
            and (described := describe(root, m)).mutated == entry.mutant.strip()
        ]
        if len(candidates) > 1:
            candidates = [m for m in candidates if m.line == entry.line] or candidates[:1]
        if not candidates:
            stale.append(entry)
        for mutant in candidates:
            matched[mutant.key] = (mutant, entry)
    sources: dict[str, list[str]] = {}
    for mutant in mutants:
        if mutant.key in matched:
            continue
        if mutant.module not in sources:
            sources[mutant.module] = (root / mutant.module).read_text().splitlines()
        line = sources[mutant.module][mutant.line - 1]
        rule = next((r for r in rules if r.matches(mutant, line)), None)
        if rule is not None:
            described = describe(root, mutant)
            reason = f"[{rule.name}] {rule.reason}"
            entry = Equivalent(
                file=mutant.module,
                line=mutant.line,
                operator=rule.operator,
                code=mutant.code,
                mutant=described.mutated,
                reason=reason,
            )
            matched[mutant.key] = (described, entry)
    return [m for m in mutants if m.key not in matched], list(matched.values()), stale


def sample(mutants: list[Mutant], n: int | None, seed: int, module: str) -> list[Mutant]:
    """`n` mutants of one module, the same ones for the same seed and source."""
    if n is None or n >= len(mutants):
        return mutants
    picked = random.Random(f"{seed}:{module}").sample(range(len(mutants)), n)
    return [mutants[i] for i in sorted(picked)]


def changed_files(repo: Path, ref: str, rev: str | None) -> set[str]:
    """Files that differ between `ref` and `rev` (the working tree when None)."""
    args = ["git", "-C", str(repo), "diff", "--name-only", ref, *([rev] if rev else [])]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"--changed {ref}: git diff failed: {done.stderr.strip()}")
    return set(done.stdout.split())
