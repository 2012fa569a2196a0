"""Mutation of the lines a submission changed: CI's `.ci/mutation` step.

    python bench/mutation_changed.py                    # HEAD since .ci/mutation-base
    python bench/mutation_changed.py --base 023c57b     # since another revision
    python bench/mutation_changed.py --working-tree     # uncommitted work too
    python bench/mutation_changed.py --list             # lines, mutants and tests; runs nothing

Sampling a few mutants per module let a change's own bugs through: the suite caught 2 of 12
bugs planted by hand in code whose sampled runs said 100% (issue 51). So every mutant of every
Python and Lua line the submission added or modified since the last landed main is made, with
every operator `bench/mutation.toml` selects (the Lua ones included), less its reviewed
equivalents; lines only deleted make none. Modules: Python files under api/, core/, workers/ and
pdppo/.

The base is the landed main the submission started from, recorded in `.ci/mutation-base`
(CI runs on a clean clone of the submitted main, which has no origin/main). A base that is
missing, not a commit here, or not an ancestor of what is mutated is named, and the last
commit's lines are mutated instead; with no last commit to fall back on the step fails.

Which tests: for each changed module, the test files nearest to it by imports (those importing
it, then its groups' `quick_tests` in `bench/mutation.toml`, then those importing a module that
imports it, ...; tests/compose, vllm, browser and contract left out: they need what this step
has not), unit files before integration ones at each distance. Coverage of those files says
which test reaches which line; a mutant runs only those tests, its line's known killers first.

Turns: a large change has more test files than any budget can run first, so nothing would be
left for mutants. So the modules take turns, in the fixed order of sha256(path): a module's
baseline runs its files nearest first (one another module's turn ran is not run again), none
but the first started past `--module-baseline` seconds or past `--baseline-share` of the budget
left, each stopped at that share; then its mutants run, in the order of
sha256("file:line:col:operator"), against whatever measured file reaches them (where the cap
left some of its files out, the output says against how many); then the next module. When
every module has had its turn with time left, those with mutants no measured file reaches run
the rest of their files, and then those mutants. A mutant none of its module's files reaches
is a survivor ("not covered"); one none of the measured files reaches while some were not
measured is not scored, and named.

Budget: nothing starts after `--budget` seconds from the start; a mutant or baseline file still
running then is stopped and not scored. Beyond the budget the run is a deterministic subset,
the first modules in full and part of the next, reported as "ran N of M mutants in k of K
modules". The step fails below `--min-kill-rate` of what it scored ((killed + timed out) /
scored), or when the budget was spent and nothing was scored, and lists each survivor with
its line, operator, mutated line and the tests that ran it.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.mutation import TIMEOUT_FACTOR, reaching, stop_on_signals
from bench.mutation_cover import BaselineRunner, Copy, make_copy
from bench.mutation_exec import (
    ERROR,
    KILLED,
    NOT_COVERED,
    Killers,
    Result,
    run_mutant,
    say_scored,
)
from bench.mutation_plan import (
    Config,
    Equivalent,
    Group,
    Mutant,
    describe,
    generate,
    generate_lua,
    load_config,
    split_equivalents,
)
from bench.mutation_proc import interrupt_all
from bench.mutation_report import ModuleRun, print_group, rate, write_json

REPO = Path(__file__).resolve().parents[1]
MUTABLE_ROOTS = ("api", "core", "workers", "pdppo")
BASE_FILE = ".ci/mutation-base"
# test directories whose files need what this step has not (Docker, the vLLM virtualenv, a
# browser, a Schemathesis run) or run for minutes
LEFT_OUT_TESTS = ("tests/compose/", "tests/vllm/", "tests/browser/", "tests/contract/")
INTEGRATION = "tests/integration/"
ORDER = "sha256(file:line:col:operator)"
MODULE_ORDER = "sha256(path)"
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


class NoBase(Exception):
    """Nothing to compare the mutated revision with: the step cannot say what changed."""


@dataclass(frozen=True)
class Base:
    rev: str  # the full hash the diff starts from
    named: str  # how to name it in the output
    warning: str = ""  # why the recorded base was not used, when it was not


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def _commit(repo: Path, name: str) -> str | None:
    done = _git(repo, "rev-parse", "--verify", "-q", f"{name}^{{commit}}")
    return done.stdout.strip() if done.returncode == 0 else None


def read_base_file(path: Path) -> str | None:
    """The revision a base file names: its first word outside `#` comments."""
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            return words[0]
    return None


BASE_HEADER = """\
# The landed main this submission started from. .ci/mutation mutates the Python and Lua lines
# changed since it (bench/mutation_changed.py). A session records its own starting revision here
# in its first commit: python bench/mutation_changed.py --record-base
"""


def record_base(repo: Path, base_file: Path, rev: str) -> str:
    """Writes `rev`'s full hash into `base_file` in place of the revision it named, its
    comments kept (the header above when it has none); returns the hash."""
    full = _commit(repo, rev)
    if full is None:
        raise NoBase(f"{rev} is not a commit in {repo}")
    path = repo / base_file
    lines = path.read_text().splitlines() if path.is_file() else []
    kept = [line for line in lines if not line.split("#", 1)[0].strip()]
    text = "\n".join(kept) + "\n" if any(kept) else BASE_HEADER
    path.write_text(text + full + "\n")
    return full


def resolve_base(repo: Path, head: str, given: str | None, base_file: Path) -> Base:
    """The revision to diff `head` against: `given`, else the one `base_file` names, when it
    is a commit here and a proper ancestor of `head`; else `head`'s first parent, with a
    warning that says why. Raises `NoBase` when even that is missing."""
    head_rev = _commit(repo, head)
    if head_rev is None:
        raise NoBase(f"{head} is not a commit in {repo}")
    origin = "--base" if given is not None else base_file.as_posix()
    name = given if given is not None else read_base_file(repo / base_file)
    if name is None:
        exists = (repo / base_file).is_file()
        problem = f"{origin} names no revision" if exists else f"{origin} is missing"
    elif (rev := _commit(repo, name)) is None:
        problem = f"{origin} names {name}, which is not a commit in this clone"
    elif rev == head_rev:
        problem = f"{origin} names {name}, the revision being mutated itself"
    elif _git(repo, "merge-base", "--is-ancestor", rev, head_rev).returncode != 0:
        problem = f"{origin} names {name}, which is not an ancestor of {head} ({head_rev[:7]})"
    else:
        return Base(rev, f"{rev[:7]} ({origin})")
    parent = _commit(repo, f"{head_rev}^")
    if parent is None:
        raise NoBase(
            f"{problem}, and {head} ({head_rev[:7]}) has no parent in this clone (its first "
            f"commit, or a shallow clone): nothing to compare with. Write the landed main's "
            f"revision into {base_file.as_posix()}, or fetch the history."
        )
    return Base(
        parent,
        f"{parent[:7]} ({head}^, the fallback)",
        f"{problem}: mutating the lines of the last commit only ({head}^..{head}). Write the "
        f"landed main this submission started from into {base_file.as_posix()} "
        f"(docs/developers/mutation.md).",
    )


def changed_lines(repo: Path, base: str, rev: str | None) -> dict[str, set[int]]:
    """The lines each mutable module gained or had modified between `base` and `rev` (the
    working tree when None), numbered in `rev`'s file. Renames are followed (a moved module's
    unchanged lines are not changed lines); lines only deleted are in no file."""
    done = _git(
        repo,
        *("-c", "core.quotepath=off", "diff", "--no-color", "--no-ext-diff", "--no-prefix"),
        *("-U0", "-M", base, *([rev] if rev else []), "--", "*.py"),
    )
    if done.returncode != 0:
        raise NoBase(f"git diff {base} {rev or ''} failed: {done.stderr.strip()}")
    found: dict[str, set[int]] = {}
    path: str | None = None
    header = False
    for line in done.stdout.splitlines():
        if line.startswith("diff --git "):
            path, header = None, True
        elif header and line.startswith("+++ "):
            name = line[4:]
            path = None if name == "/dev/null" else name
        elif (hunk := _HUNK.match(line)) is not None:
            header = False
            count = 1 if hunk.group(2) is None else int(hunk.group(2))
            if path is not None and count and path.split("/", 1)[0] in MUTABLE_ROOTS:
                start = int(hunk.group(1))
                found.setdefault(path, set()).update(range(start, start + count))
    return found


# --- which tests ---------------------------------------------------------------------------


def module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def import_graph(root: Path) -> dict[str, set[str]]:
    """file -> the files of this repository (product and tests) it imports, at any level of
    the file (a test's function-level import counts). `from a import b` is the module `a.b`
    when there is one, else `a`; `import a.b.c` is `a.b.c` (its packages' `__init__` are not
    followed: every test would reach `pdppo/__init__.py`)."""
    files = [
        p.relative_to(root).as_posix()
        for top in (*MUTABLE_ROOTS, "tests")
        for p in sorted((root / top).rglob("*.py"))
    ]
    by_name = {module_name(f): f for f in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        try:
            tree = ast.parse((root / path).read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        package = module_name(path)  # what a relative import starts from
        if not path.endswith("__init__.py"):
            package = package.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(by_name[a.name] for a in node.names if a.name in by_name)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".") if package else []
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                for alias in node.names:
                    name = f"{base}.{alias.name}"
                    if name in by_name:
                        targets.add(by_name[name])
                    elif base in by_name:
                        targets.add(by_name[base])
        targets.discard(path)
        graph[path] = targets
    return graph


def is_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return (
        path.startswith("tests/")
        and name.startswith("test_")
        and name.endswith(".py")
        and not path.startswith(LEFT_OUT_TESTS)
    )


def import_distances(graph: dict[str, set[str]], module: str) -> dict[str, int]:
    """Each test file that reaches `module` through imports, and in how many (1: it imports
    the module itself)."""
    importers: dict[str, set[str]] = {}
    for path, targets in graph.items():
        for target in targets:
            importers.setdefault(target, set()).add(path)
    distance = {module: 0}
    todo = [module]
    while todo:
        nearer: list[str] = []
        for path in todo:
            for importer in sorted(importers.get(path, ())):
                if importer not in distance:
                    distance[importer] = distance[path] + 1
                    nearer.append(importer)
        todo = nearer
    return {path: d for path, d in distance.items() if d and is_test_file(path)}


def groups_of(config: Config, module: str) -> list[Group]:
    return [g for g in config.groups if any(fnmatch.fnmatchcase(module, p) for p in g.modules)]


def module_tests(
    root: Path, config: Config, graph: dict[str, set[str]], module: str
) -> list[tuple[str, str]]:
    """(test, why) for one module, nearest first: the files importing it (unit files before
    `tests/integration/` ones), then its groups' `quick_tests` (curated to reach what its unit
    tests do not, at a bounded cost), then the files a further import away."""
    distances = import_distances(graph, module)

    def by_distance(d: int) -> list[str]:
        found = [t for t, at in distances.items() if (at == 1) == (d == 1)]
        return sorted(found, key=lambda t: (distances[t], t.startswith(INTEGRATION), t))

    picked = [(t, "imports it") for t in by_distance(1)]
    for group in groups_of(config, module):
        picked += [
            (t, f"quick test of group {group.name}")
            for t in group.quick_tests
            if (root / t.split("::", 1)[0]).is_file()
        ]
    picked += [(t, f"{distances[t]} imports away") for t in by_distance(2)]
    first: dict[str, str] = {}
    for test, why in picked:
        first.setdefault(test, why)
    return list(first.items())


def pick_tests(root: Path, config: Config, modules: list[str]) -> dict[str, list[tuple[str, str]]]:
    """Each module's (test, why), nearest first (`module_tests`): its turn's baseline runs
    them in that order, as far as its share of the budget goes."""
    graph = import_graph(root)
    return {m: module_tests(root, config, graph, m) for m in modules}


# --- the mutants ---------------------------------------------------------------------------


def order_key(mutant: Mutant) -> tuple[str, int]:
    """The fixed order a module's mutants start in: a hash of where they are and what they
    change, so that a module cut by the budget is a spread over its lines, the same one each
    time, rather than its first function."""
    text = f"{mutant.module}:{mutant.line}:{mutant.col}:{mutant.short_operator}"
    return hashlib.sha256(text.encode()).hexdigest(), mutant.occurrence


def module_key(module: str) -> str:
    """The fixed order the modules take their turns in: a hash of the path, so that a change cut
    by the budget is the same modules each time, and not always those first by name."""
    return hashlib.sha256(module.encode()).hexdigest()


@dataclass
class ModulePlan:
    module: str
    lines: set[int]
    mutants: list[Mutant]  # on the changed lines, less the reviewed equivalents
    equivalents: list[tuple[Mutant, Equivalent]]  # on the changed lines


def plan_module(root: Path, config: Config, module: str, lines: set[int]) -> ModulePlan:
    """Every mutant of `module` (Python and Lua) on `lines`, its reviewed equivalents apart.
    Only the mutants on those lines are matched with the entries (describing a mutant parses
    the module again): stale entries are the full run's to report, not this step's."""
    python, _ = generate(root, module, config.operators)
    lua: list[Mutant] = []
    if config.lua_operators:
        others = tuple(
            path.relative_to(root).as_posix()
            for group in groups_of(config, module)
            if group.lua
            for pattern in group.modules
            for path in sorted(root.glob(pattern))
        )
        lua, _ = generate_lua(root, module, config.lua_operators, tuple(dict.fromkeys(others)))
    on_lines = [m for m in python + lua if m.line in lines]
    entries = tuple(e for e in config.equivalents if e.file == module)
    kept, equivalents, _ = split_equivalents(root, on_lines, entries, config.rules)
    return ModulePlan(module, lines, kept, equivalents)


# --- running them --------------------------------------------------------------------------


@dataclass
class Dispatched:
    results: list[Result]  # scored or not (errors), in the order they ended
    not_started: list[Mutant]  # the budget ended before their turn
    stopped: list[Mutant]  # running when the budget ended: not scored


def dispatch(
    todo: list[Mutant],
    workers: int,
    run: Callable[[Mutant], Result],
    deadline: float | None,
    on_result: Callable[[Result], None] = lambda r: None,
    clock: Callable[[], float] = time.monotonic,
    stop: Callable[[], None] = interrupt_all,
) -> Dispatched:
    """Runs `todo` in its order, `workers` at a time, starting none at or after `deadline`;
    at the deadline, `stop` ends what still runs, and those are not scored. What ran is the
    beginning of `todo`, less the stopped ones."""
    done: list[Result] = []
    running: dict[Future[Result], Mutant] = {}
    waiting = list(reversed(todo))

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - clock())

    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            while waiting or running:
                while (
                    waiting and len(running) < workers and (deadline is None or clock() < deadline)
                ):
                    mutant = waiting.pop()
                    running[pool.submit(run, mutant)] = mutant
                if not running:
                    break
                ended, _ = wait(running, timeout=left(), return_when=FIRST_COMPLETED)
                for future in ended:
                    running.pop(future)
                    done.append(future.result())
                    on_result(done[-1])
                if deadline is not None and clock() >= deadline:
                    break
        except KeyboardInterrupt:  # before the pool's exit, which waits for the running ones
            stop()
            raise
        stopped = list(running.values())
        if running:
            stop()  # the pool's exit waits for their threads, which return once stopped
    order = {id(m): i for i, m in enumerate(todo)}
    stopped.sort(key=lambda m: order[id(m)])
    return Dispatched(done, list(reversed(waiting)), stopped)


def verdict(detected: int, scored: int, minimum: Fraction) -> bool:
    """Whether a kill rate meets the threshold, exactly (9 of 10 is 90%, not 89.99...%)."""
    return scored > 0 and Fraction(detected, scored) >= minimum


NAMED_TESTS = 12  # a survivor's tests are named up to this many; past it, counted per file


def reaching_by_file(tests: list[str]) -> str:
    """`file: test, test (3 cases)` per file, a parametrized test once; past `NAMED_TESTS`
    tests, `file (n tests)`: a module-level line reaches every test of its files."""
    files: dict[str, dict[str, int]] = {}
    for test in tests:
        path, _, name = test.partition("::")
        cases = files.setdefault(path, {})
        name = name.split("[", 1)[0]
        cases[name] = cases.get(name, 0) + 1
    if len(tests) > NAMED_TESTS:
        counts = {path: sum(names.values()) for path, names in files.items()}
        return "; ".join(f"{p} ({n} test{'s' * (n > 1)})" for p, n in counts.items())
    return "; ".join(
        f"{path}: "
        + ", ".join(f"{name} ({n} cases)" if n > 1 else name for name, n in names.items())
        for path, names in files.items()
    )


def print_survivors(results: list[Result], reach: dict[str, list[str]]) -> None:
    """Each survivor: where, which operator, the line before and after, the tests that ran it."""
    survivors = [r for r in results if r.outcome in ("survived", NOT_COVERED)]
    if not survivors:
        return
    print(f"\nsurvivors ({len(survivors)}):")
    for result in sorted(survivors, key=lambda r: (r.mutant.module, r.mutant.line)):
        m = result.mutant
        print(f"  {m.module}:{m.line}  {m.short_operator}")
        print(f"      - {m.code}\n      + {m.mutated}")
        tests = reach.get(m.key, [])
        if result.outcome == NOT_COVERED or not tests:
            print(f"      not covered: {result.detail or 'no test runs this line'}")
        else:
            print(f"      ran by {len(tests)} tests, none failed: {reaching_by_file(tests)}")


@dataclass
class Turns:
    """What the modules' turns did: each mutant ends in exactly one of `results` (run),
    `uncovered` (no test file of its module reaches its line), `unknown` (none of the files
    measured reaches it, and some of its module's files were not measured), `stopped` (running
    at the deadline) or `not_started` (its module's turn, or its own, came after the deadline)."""

    had_turn: list[str] = field(default_factory=list)  # modules, in the order they had it
    tried: dict[str, str] = field(default_factory=dict)  # test file -> "" measured, else why not
    results: list[Result] = field(default_factory=list)
    uncovered: list[tuple[Mutant, str]] = field(default_factory=list)
    unknown: dict[str, list[Mutant]] = field(default_factory=dict)
    stopped: list[Mutant] = field(default_factory=list)
    not_started: list[Mutant] = field(default_factory=list)
    budget_spent: bool = False


def take_turns(
    plans: list[ModulePlan],
    tests: dict[str, list[str]],
    measure: Callable[[str, float], str],
    reach: Callable[[Mutant], list[str]],
    run: Callable[[list[Mutant], float], Dispatched],
    deadline: float,
    cap: float,
    share: float,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> Turns:
    """The modules in the order of `plans` (`module_key`), each in its turn: the baseline of
    its test files nearest first (`measure(file, stop_at)`: "" when its coverage is in, else
    why not), none started past `cap` seconds nor past `share` of the budget left, the first
    always, each stopped at that share; then its mutants (`run`, in `order_key` order) against
    whatever measured file reaches them, until `deadline`. A file another module's turn ran is
    not run again. The subset a budget leaves is then the first modules in full and part of the
    next: always a beginning of the same order, its length set by the machine's speed.

    When every module has had its turn and time is left, the modules with mutants no measured
    file reaches take a second turn, in the same order, with the rest of their files (none
    stopped before the deadline), and run what those reach. A file stopped at its limit, or
    failing unmutated, is not run again."""
    turns = Turns()
    waiting = {p.module: sorted(p.mutants, key=order_key) for p in plans}
    for second in (False, True):
        for plan in plans:
            module = plan.module
            mine = tests.get(module, [])
            untried = [t for t in mine if t not in turns.tried]
            if clock() >= deadline or (second and not untried):
                continue
            unknown = turns.unknown.pop(module, [])
            candidates = waiting[module] + unknown
            if not candidates:
                continue
            begin = clock()
            stop_at = deadline if second else begin + share * (deadline - begin)
            start_by = stop_at if second else min(begin + cap, stop_at)
            if not second:
                turns.had_turn.append(module)
            cap_line = f"; none but its first file starts after {start_by - begin:.0f}s"
            say(
                f"\n{'second turn' if second else 'turn'} of {module}: {len(candidates)} "
                f"mutants, {len(mine) - len(untried)} of its {len(mine)} test files measured"
                + (cap_line if untried else "")
            )
            for index, test in enumerate(untried):
                if (index and clock() >= start_by) or clock() >= deadline:
                    break
                turns.tried[test] = measure(test, min(stop_at, deadline))
            if clock() >= deadline:  # as they were: not started, or not known
                turns.unknown.update({module: unknown} if unknown else {})
                continue
            waiting[module] = []
            todo: list[Mutant] = []
            unreached: list[Mutant] = []
            for mutant in candidates:
                (todo if reach(mutant) else unreached).append(mutant)
            if all(turns.tried.get(t) == "" for t in mine):
                why = (
                    f"none of the {len(mine)} test files run for {module} reaches it"
                    if mine
                    else f"no test file imports {module}, nor lists it in a group of "
                    "bench/mutation.toml"
                )
                turns.uncovered += [(m, why) for m in unreached]
            elif unreached:
                turns.unknown[module] = unreached
            ran = run(todo, deadline)
            turns.results += ran.results
            turns.stopped += ran.stopped
            waiting[module] = ran.not_started
    turns.not_started = [m for p in plans for m in waiting[p.module]]
    turns.budget_spent = clock() >= deadline
    return turns


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", metavar="REV", help=f"compare with REV, not {BASE_FILE}'s")
    parser.add_argument("--base-file", type=Path, default=Path(BASE_FILE))
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--rev", default="HEAD", help="commit to mutate (default HEAD)")
    where.add_argument("--working-tree", action="store_true", help="mutate the working tree")
    parser.add_argument("--budget", type=float, default=480.0, metavar="S", help="seconds")
    parser.add_argument(
        "--module-baseline",
        type=float,
        default=60.0,
        metavar="S",
        help="in a module's turn, no baseline test file but its first starts past S seconds "
        "(default 60)",
    )
    parser.add_argument(
        "--baseline-share",
        type=float,
        default=0.5,
        metavar="F",
        help="nor past this share of the budget left at its turn, when each is stopped "
        "(default 0.5)",
    )
    parser.add_argument("--workers", type=int, default=1, help="mutants at a time, one copy each")
    parser.add_argument("--min-kill-rate", type=str, default="0.9", metavar="R")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every result here")
    parser.add_argument("--list", action="store_true", help="print the plan, run nothing")
    parser.add_argument(
        "--record-base",
        action="store_true",
        help="write --rev (HEAD) into --base-file, as a session's first commit does, and exit",
    )
    parser.add_argument("--config", type=Path, default=REPO / "bench" / "mutation.toml")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.module_baseline < 0:
        parser.error("--module-baseline is a number of seconds, 0 or more")
    if not 0 < args.baseline_share <= 1:
        parser.error("--baseline-share is a fraction above 0, at most 1")
    try:
        args.min_kill_rate = Fraction(args.min_kill_rate)
    except ValueError:
        parser.error("--min-kill-rate is a fraction between 0 and 1")
    if not 0 <= args.min_kill_rate <= 1:
        parser.error("--min-kill-rate is a fraction between 0 and 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget
    stop_on_signals()
    config = load_config(args.config)
    rev = None if args.working_tree else args.rev
    if args.record_base:
        try:
            full = record_base(REPO, args.base_file, args.rev)
        except NoBase as exc:
            print(f"FAIL: {exc}")
            return 2
        print(f"{args.base_file}: {full}")
        return 0
    try:
        base = resolve_base(REPO, "HEAD" if rev is None else rev, args.base, args.base_file)
        changed = changed_lines(REPO, base.rev, rev)
    except NoBase as exc:
        print(f"FAIL: {exc}")
        return 2
    if base.warning:
        print(f"WARNING: {base.warning}")
    what = "the working tree" if rev is None else rev
    print(f"mutating the lines of {what} changed since {base.named}")
    workdir = Path(tempfile.mkdtemp(prefix="pdppo-mutation-changed-"))
    copies: list[Copy] = []
    try:
        return _run(args, config, changed, base, rev, deadline, started, workdir, copies)
    except KeyboardInterrupt as exc:
        print(f"stopped by {exc or 'SIGINT'}")
        return 130
    finally:
        for copy in copies:
            copy.remove()
        shutil.rmtree(workdir, ignore_errors=True)


def _run(
    args: argparse.Namespace,
    config: Config,
    changed: dict[str, set[int]],
    base: Base,
    rev: str | None,
    deadline: float,
    started: float,
    workdir: Path,
    copies: list[Copy],
) -> int:
    for index in range(1 if args.list else args.workers):
        copies.append(make_copy(REPO, workdir / f"copy-{index}", rev))
    root = copies[0].root
    plans = [plan_module(root, config, m, lines) for m, lines in changed.items()]
    plans = sorted(
        (p for p in plans if p.mutants or p.equivalents), key=lambda p: module_key(p.module)
    )
    total = sum(len(p.mutants) for p in plans)
    lines = sum(len(lines) for lines in changed.values())
    print(f"{lines} changed lines in {len(changed)} modules; {total} mutants on them")
    picked = pick_tests(root, config, [p.module for p in plans if p.mutants])
    tests = {m: [t for t, _ in pairs] for m, pairs in picked.items()}
    print(f"modules in the order of {MODULE_ORDER}:")
    for plan in plans:
        print(
            f"  {plan.module}: {len(plan.lines)} lines, {len(plan.mutants)} mutants, "
            f"{len(plan.equivalents)} equivalent; {len(tests.get(plan.module, []))} test files"
        )
        for test, why in picked.get(plan.module, []) if args.list else []:
            print(f"      test: {test}  ({why})")
    meta: dict[str, Any] = {
        "rev": what_rev(root, rev),
        "base": base.rev,
        "module_order": MODULE_ORDER,
        "order": ORDER,
    }
    if args.list:
        return 0
    if not total:
        print("nothing to mutate: no mutant on a changed line, less the reviewed equivalents")
        return 0

    measured = {p.module for p in plans if p.mutants}
    measured |= {f for p in plans for m in p.mutants for f, _ in m.foreign}
    runner = BaselineRunner(root, tuple(sorted(measured)), workdir / "baseline", skip_failing=True)
    runs = {p.module: ModuleRun(p.module, len(p.mutants) + len(p.equivalents), {},
                                p.equivalents, len(p.mutants)) for p in plans}  # fmt: skip
    reach: dict[str, list[str]] = {}
    killers = Killers()
    free: queue.Queue[int] = queue.Queue()
    for index in range(len(copies)):
        free.put(index)
    count = [0]

    def reaching_now(mutant: Mutant) -> list[str]:
        reach[mutant.key] = reaching(runner.baseline, mutant)
        return reach[mutant.key]

    def run(mutant: Mutant) -> Result:
        index = free.get()
        tests_in_order = killers.order(mutant, reach[mutant.key])
        confirm = any(g.confirm_kills for g in groups_of(config, mutant.module)) or any(
            t.startswith(INTEGRATION) for t in tests_in_order
        )
        try:
            result = run_mutant(
                copies[index].root,
                mutant,
                tests_in_order,
                timeout=runner.baseline.timeout_for(tests_in_order, TIMEOUT_FACTOR),
                basetemp=workdir / f"pytest-{index}",
                confirm=confirm,
                test_timeouts=runner.baseline.test_timeouts_for(tests_in_order, TIMEOUT_FACTOR),
            )
        finally:
            free.put(index)
        if result.outcome == KILLED:
            killers.add(mutant.module, mutant.line, result.killer)
        return result

    def scored(result: Result) -> None:
        runs[result.mutant.module].results.append(result)
        count[0] += 1
        say_scored(result, count[0], total)
        if args.json:
            write_json(args.json, list(runs.values()), meta)

    def measure(test: str, stop_at: float) -> str:
        why = runner.run(test, stop_at)
        if why:
            print(f"  baseline left out {test}: {why}", flush=True)
        return why

    turns = take_turns(
        [p for p in plans if p.mutants],
        tests,
        measure=measure,
        reach=reaching_now,
        run=lambda todo, until: dispatch(todo, len(copies), run, until, scored),
        deadline=deadline,
        cap=args.module_baseline,
        share=args.baseline_share,
    )
    for mutant, why in turns.uncovered:
        runs[mutant.module].results.append(
            Result(
                mutant=describe(root, mutant),
                outcome=NOT_COVERED,
                seconds=0.0,
                tests=0,
                killer="",
                detail=why,
            )
        )
    print(f"\nbaseline: {len(runner.measured)} test files, {runner.baseline.seconds:.0f}s")
    meta.update(
        not_started=len(turns.not_started),
        stopped=len(turns.stopped),
        unknown=sum(len(ms) for ms in turns.unknown.values()),
        modules_in_turn_order=turns.had_turn,
        seconds=round(time.monotonic() - started, 1),
    )
    return report(
        args,
        root,
        base,
        runs=[runs[p.module] for p in plans],
        turns=turns,
        tests=tests,
        reach=reach,
        meta=meta,
        started=started,
    )


def report(
    args: argparse.Namespace,
    root: Path,
    base: Base,
    runs: list[ModuleRun],
    turns: Turns,
    tests: dict[str, list[str]],
    reach: dict[str, list[str]],
    meta: dict[str, Any],
    started: float,
) -> int:
    """Prints the table, the survivors, what the budget and the caps left out; the exit
    status."""
    print_group("lines changed since " + base.named, runs, reach, survivors=False)
    print_survivors([r for run in runs for r in run.results], reach)
    total = sum(run.planned for run in runs)
    detected = sum(run.detected for run in runs)
    scored = sum(run.scored for run in runs)
    with_mutants = [run for run in runs if run.planned]
    full = [run.module for run in with_mutants if len(run.results) == run.planned]
    meta.update(ran=scored, mutants=total, modules_in_full=len(full))
    if args.json:
        write_json(args.json, runs, meta)
    print(
        f"\nran {scored} of {total} mutants in {len(full)} of {len(with_mutants)} modules", end=""
    )
    if scored < total:
        unknown = sum(len(ms) for ms in turns.unknown.values())
        parts = [
            f"{len(turns.not_started)} not started",
            f"{len(turns.stopped)} stopped at the budget",
            f"{unknown} not reached by the test files measured",
        ]
        errors = sum(1 for r in turns.results if r.outcome == ERROR)
        parts += [f"{errors} errors"] if errors else []
        print(
            f" (budget {args.budget:.0f}s; modules in the order of {MODULE_ORDER}, their "
            f"mutants in that of {ORDER}: {', '.join(parts)})"
        )
    else:
        print()
    for run in with_mutants:
        module = run.module
        mine = tests.get(module, [])
        measured = [t for t in mine if turns.tried.get(t) == ""]
        if module not in turns.had_turn:
            continue
        if len(run.results) < run.planned and run.results:
            print(f"  {module}: {len(run.results)} of its {run.planned} mutants ran")
        if len(measured) < len(mine):
            why = Counter(w for w in (turns.tried.get(t, "not started") for t in mine) if w)
            print(
                f"  {module}: its mutants ran against the {len(measured)} of its {len(mine)} "
                f"test files measured ({', '.join(f'{n} {w}' for w, n in why.items())})"
            )
        if module in turns.unknown:
            where = sorted({m.line for m in turns.unknown[module]})
            print(
                f"      {len(turns.unknown[module])} not reached by those, not scored: "
                f"line{'s' * (len(where) > 1)} {', '.join(map(str, where))}"
            )
    waited = [f"{r.module} ({r.planned})" for r in with_mutants if r.module not in turns.had_turn]
    if waited:
        print(f"  no turn (the budget ended before it), {len(waited)}: {', '.join(waited)}")
    for mutant in turns.stopped:
        m = describe(root, mutant)
        print(f"  stopped at the budget: {m.module}:{m.line} {m.short_operator}: {m.mutated}")
    print(f"({(time.monotonic() - started) / 60:.1f} min in all)")
    if not scored:
        errors = sum(1 for r in turns.results if r.outcome == ERROR)
        if turns.budget_spent or errors:
            spent = "the budget was spent" if turns.budget_spent else f"{errors} errors"
            print(f"FAIL: none of the {total} mutants was scored ({spent})")
            return 1
        print(
            f"ok: none of the {total} mutants was scored: no test file measured reaches them, "
            "and their modules' other files fail unmutated (the test step fails on those)"
        )
        return 0
    kill = f"kill rate {rate(detected, scored).strip()} ({detected} of {scored})"
    if not verdict(detected, scored, args.min_kill_rate):
        print(f"FAIL: {kill} < {float(args.min_kill_rate):.0%}")
        return 1
    print(f"ok: {kill} >= {float(args.min_kill_rate):.0%}")
    return 0


def what_rev(root: Path, rev: str | None) -> str:
    if rev is None:
        return "working tree"
    return _git(root, "rev-parse", "--short", "HEAD").stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
