"""Running one mutant: cosmic-ray writes it into the copy, pytest runs the tests that reach its
line (known killers first, then the quickest: `Killers`; stopping at the first failure), and
the file is put back. A timed-out run leaves no server behind (`bench/mutation_proc.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import cosmic_ray.plugins
from cosmic_ray.mutating import use_mutation

from bench import mutation_lua
from bench.mutation_cover import UNUSED_PLUGINS, test_env
from bench.mutation_plan import Mutant, changed_text, describe
from bench.mutation_proc import run_command

KILLED, TIMEOUT, SURVIVED, NOT_COVERED, FLAKY, ERROR = (
    "killed",
    "timeout",
    "survived",
    "not covered",
    "flaky",
    "error",
)
# pytest's exit codes: 1 tests failed, 2 interrupted (a collection error: the mutant broke an
# import), 3 internal error; 4 (usage) and 5 (nothing collected) are this tool's fault, except
# where the mutant broke an import (4 too): a conftest that no longer loads, or a test module
# that no longer collects, whose node ids then cannot be found.
KILLING_EXIT_CODES = {1, 2, 3}
USAGE_ERROR = 4
IMPORT_BROKEN = ("while loading conftest", "ERROR collecting")
BOUNDS_PLUGIN = "mutation_bounds"  # bench/mutation_bounds.py: each test's own timeout
_TEST_TIMEOUT = "from pytest-timeout"  # "Failed: Timeout (>60.0s) from pytest-timeout."
# "FAILED <nodeid> - <message>" in pytest's short summary; parameters may hold spaces
_FAILED = re.compile(r"^(?:FAILED|ERROR) ([^\s\[]+(?:\[.*?\])?)(?: - |$)", re.MULTILINE)


@dataclass(frozen=True)
class Result:
    mutant: Mutant
    outcome: str
    seconds: float
    tests: int
    killer: str
    detail: str


def say_scored(result: Result, done: int, total: int) -> None:
    """One progress line on stderr, flushed: a CI log shows a long run as it goes."""
    m = result.mutant
    by = f" by {result.killer}" if result.killer else ""
    print(
        f"  [{done}/{total}] {m.module}:{m.line} {m.short_operator} "
        f"{result.outcome}{by} ({result.seconds:.0f}s, {result.tests} tests)",
        file=sys.stderr,
        flush=True,
    )


class Killers:
    """The tests that killed each module's mutants so far, by line, to run first.

    With the quickest tests first, a killed mutant of a module-level line (which every test
    reaches) ran some sixty tests before its killer: a minute where ten seconds do. But the
    mutants of one line, or one function, mostly fall to the same test. So a mutant's reaching
    tests run with the known killers first, those of the nearest lines first; only the order
    changes, and a mutant still runs every reaching test until one fails. Filled from `--carry`
    and from this run's kills, from several threads."""

    def __init__(self) -> None:
        self._lines: dict[str, list[tuple[int, str]]] = {}
        self._lock = threading.Lock()

    def add(self, module: str, line: int, test: str) -> None:
        with self._lock:
            self._lines.setdefault(module, []).append((line, test))

    def order(self, mutant: Mutant, tests: list[str]) -> list[str]:
        reaching = set(tests)
        with self._lock:
            known = sorted(
                (abs(line - mutant.line), test)
                for line, test in self._lines.get(mutant.module, [])
                if test in reaching
            )
        first = list(dict.fromkeys(test for _, test in known))
        return first + [test for test in tests if test not in first]


def pytest_command(tests: list[str], basetemp: Path, bounds: dict[str, float] | None) -> list[str]:
    # a test the bounds do not name (none should be) gets the largest
    each = ["-p", BOUNDS_PLUGIN, f"--timeout={max(bounds.values()):.0f}"] if bounds else []
    return [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        *UNUSED_PLUGINS,
        f"--basetemp={basetemp}",
        *each,
        *tests,
    ]


def _with_bounds(
    env: dict[str, str], basetemp: Path, bounds: dict[str, float] | None
) -> dict[str, str]:
    """`env` with `mutation_bounds` on the path and reading `bounds`: both beside `basetemp`,
    which pytest empties at its start, and one pair per copy (two copies run at once)."""
    if not bounds:
        return env
    plugin_dir = basetemp.parent / f"{basetemp.name}-plugin"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).parent / f"{BOUNDS_PLUGIN}.py", plugin_dir)
    path = basetemp.parent / f"{basetemp.name}-bounds.json"
    path.write_text(json.dumps(bounds))
    env = {**env, "PDPPO_MUTATION_BOUNDS": str(path)}
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(plugin_dir)])
    return env


Applied = contextlib.AbstractContextManager[tuple[str, str | None]]


def _applied(path: Path, mutant: Mutant) -> Applied:
    """The mutant written into `path` for the length of a `with` (a Lua body's or cosmic-ray's)."""
    if mutation_lua.is_lua(mutant.operator):
        return mutation_lua.use_lua_mutation(path, mutant.operator, mutant.occurrence)
    operator = cosmic_ray.plugins.get_operator(mutant.operator)()
    return use_mutation(path, operator, mutant.occurrence)


def run_mutant(
    copy: Path,
    mutant: Mutant,
    tests: list[str],
    timeout: float,
    basetemp: Path,
    confirm: bool,
    test_timeouts: dict[str, float] | None = None,
) -> Result:
    """Runs `tests` against `mutant`, in `timeout` seconds in all and (pytest-timeout) each in
    its `test_timeouts` bound: a test over its own bound is a TIMEOUT, as a run over `timeout` is,
    without waiting for the rest. With `confirm`, a kill counts only if the same tests, up to
    the killing one, fail again on a second run: a loaded machine times out integration tests now
    and then, and one such failure would hide a survivor (a kill that does not repeat is FLAKY,
    not counted)."""
    if not tests:
        return Result(
            mutant=describe(copy, mutant),
            outcome=NOT_COVERED,
            seconds=0.0,
            tests=0,
            killer="",
            detail="no test runs this line",
        )
    started = time.monotonic()
    with _applied(copy / mutant.module, mutant) as (original, mutated):
        if mutated is None:
            return Result(
                mutant=mutant,
                outcome=ERROR,
                seconds=0.0,
                tests=0,
                killer="",
                detail="cosmic-ray applied no mutation here",
            )
        mutant = replace(mutant, mutated=changed_text(original, mutated))
        env = _with_bounds(test_env(copy), basetemp, test_timeouts)
        command = pytest_command(tests, basetemp, test_timeouts)
        code, out = run_command(command, copy, env, timeout)
        found = _FAILED.search(out)
        killer = found.group(1) if found and code in KILLING_EXIT_CODES else ""
        hung = bool(killer) and _TEST_TIMEOUT in out
        again = None
        if confirm and "::" in killer and not hung:  # a collection error repeats for sure
            # the same tests up to the killer: a kill may need what the earlier ones left behind
            upto = tests[: tests.index(killer) + 1] if killer in tests else tests
            again, _ = run_command(
                pytest_command(upto, basetemp, test_timeouts), copy, env, timeout
            )
    seconds = time.monotonic() - started
    if code is None:
        return Result(
            mutant=mutant,
            outcome=TIMEOUT,
            seconds=seconds,
            tests=len(tests),
            killer="",
            detail=f"over {timeout:.0f}s",
        )
    if hung:
        return Result(
            mutant=mutant,
            outcome=TIMEOUT,
            seconds=seconds,
            tests=len(tests),
            killer=killer,
            detail="over its pytest-timeout",
        )
    if code == 0:
        return Result(
            mutant=mutant, outcome=SURVIVED, seconds=seconds, tests=len(tests), killer="", detail=""
        )
    if code == USAGE_ERROR and any(sign in out for sign in IMPORT_BROKEN):
        return Result(
            mutant=mutant,
            outcome=KILLED,
            seconds=seconds,
            tests=len(tests),
            killer="(an import at collection)",
            detail="",
        )
    if code in KILLING_EXIT_CODES:
        if again == 0:
            # the first run's failure (in the --json), to tell a flaky test from a racing mutant
            why = "passed when run again; the first run ended:\n" + out[-1500:]
            return Result(
                mutant=mutant,
                outcome=FLAKY,
                seconds=seconds,
                tests=len(tests),
                killer=killer,
                detail=why,
            )
        unconfirmed = again is not None and again not in KILLING_EXIT_CODES
        note = f"not confirmed: the rerun ended with pytest exit {again}" if unconfirmed else ""
        return Result(
            mutant=mutant,
            outcome=KILLED,
            seconds=seconds,
            tests=len(tests),
            killer=killer,
            detail=note,
        )
    return Result(
        mutant=mutant,
        outcome=ERROR,
        seconds=seconds,
        tests=len(tests),
        killer="",
        detail=f"pytest exit {code}: {out[-2000:]}",
    )
