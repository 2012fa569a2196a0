"""The copies `bench/mutation.py` mutates, and the baseline run that says which tests reach
which line.

Mutants are written to disk (cosmic-ray's way), so they are never written in the checkout a
person works in: each worker gets its own copy, a `git worktree` of a commit or a copy of the
working tree, and every test process runs with `PYTHONPATH=<copy>` and the copy as its working
directory. The API and workers the integration tests start inherit both, so they import the
mutant too (the editable install's finder comes after `sys.path` in `sys.meta_path`).

The baseline runs each test file once, unmutated, under coverage with subprocess measurement
(coverage.py's `.pth` hook, `COVERAGE_PROCESS_START`). In-process lines are charged to the test
that ran them; a child process's lines to the one test it lived in, or to every test of the file
when it outlived one (a session's API) or was too short-lived to be seen; import-time lines to
every test of the file (`bench/mutation_contexts.py`), found in the module's source
(`import_time_lines`): a module imported inside a test runs them under that test's context only.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import coverage

HERE = Path(__file__).resolve().parent
PLUGIN = "mutation_contexts"
DATA_PID = re.compile(r"\.pid(\d+)\.")  # coverage's data file suffix: <host>.pid<pid>.X<random>


class BaselineFailed(RuntimeError):
    """The unmutated tests fail: every mutant would look killed."""


@dataclass
class Copy:
    """A tree to mutate, and how to remove it."""

    root: Path
    repo: Path
    worktree: bool

    def remove(self) -> None:
        if self.worktree:
            git = ["git", "-C", str(self.repo), "worktree", "remove", "--force", str(self.root)]
            subprocess.run(git, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def make_copy(repo: Path, dest: Path, rev: str | None) -> Copy:
    """`rev` checked out as a detached worktree at `dest`, or (None) the working tree's tracked
    and untracked, not ignored, files copied there."""
    if rev is not None:
        git = ["git", "-C", str(repo), "worktree", "add", "--detach", str(dest), rev]
        done = subprocess.run(git, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"--rev {rev}: git worktree add failed: {done.stderr.strip()}")
        return Copy(dest, repo, worktree=True)
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = repo / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return Copy(dest, repo, worktree=False)


def test_env(copy: Path, extra_path: Path | None = None) -> dict[str, str]:
    """The environment of every test process: the copy first on the path, no stale bytecode."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}
    paths = [str(copy), *([str(extra_path)] if extra_path else [])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    # Mutants replace a file within the same second: a cached .pyc could be taken for current.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclass
class Baseline:
    """Which tests reach each line of each module, and how long each test takes."""

    order: list[str] = field(default_factory=list)
    call: dict[str, float] = field(default_factory=dict)
    total: dict[str, float] = field(default_factory=dict)
    file_of: dict[str, str] = field(default_factory=dict)
    overhead: dict[str, float] = field(default_factory=dict)
    reach: dict[str, dict[int, set[str]]] = field(default_factory=dict)
    seconds: float = 0.0
    _position: dict[str, int] = field(default_factory=dict, repr=False)

    def tests_for(self, module: str, line: int) -> list[str]:
        """The tests that ran `line`, quickest first (the likeliest cheap killers)."""
        tests = self.reach.get(module, {}).get(line, set())
        if len(self._position) != len(self.order):  # built once, after the baseline filled it
            self._position = {nodeid: i for i, nodeid in enumerate(self.order)}
        return sorted(tests, key=lambda t: (self.call.get(t, 0.0), self._position.get(t, 0)))

    def timeout_for(self, tests: list[str], factor: float) -> float:
        """`factor` times the tests' own baseline time (set-up included), plus the slowest of
        their files' start-up, plus a minute: a mutant that only slows a test down a little is
        not taken for a hang."""
        own = sum(self.total.get(t, 0.0) for t in tests)
        return factor * own + self._start(tests) + 60.0

    def test_timeouts_for(self, tests: list[str], factor: float) -> dict[str, float]:
        """Each test's own bound (pytest-timeout's, through `mutation_bounds`): the same from
        its time alone. A mutant that hangs a test then costs that test's bound, not the whole
        run's `timeout_for`. The start-up stays in: a session fixture's set-up is charged to the
        first test of its file in the baseline, and a mutant's tests run in another order."""
        return {t: factor * self.total.get(t, 0.0) + self._start(tests) + 60.0 for t in tests}

    def _start(self, tests: list[str]) -> float:
        return max((self.overhead.get(self.file_of.get(t, ""), 0.0) for t in tests), default=0)


def _rc_file(workdir: Path, copy: Path, modules: tuple[str, ...], data_dir: Path) -> Path:
    include = "\n".join(f"    {copy / m}" for m in modules)
    rc = workdir / "coveragerc"
    rc.write_text(
        "[run]\n"
        "parallel = true\n"
        f"data_file = {data_dir / '.coverage'}\n"
        f"include =\n{include}\n"
        # job processes leave through os._exit and come from a fork server; Service.stop ends
        # the API and workers with SIGTERM
        "patch =\n    _exit\n    fork\n"
        "sigterm = true\n"
    )
    return rc


def run_baseline(
    copy: Path, modules: tuple[str, ...], test_files: list[str], workdir: Path
) -> Baseline:
    """Runs each test file unmutated under coverage; raises `BaselineFailed` if any test fails."""
    plugin_dir = workdir / "plugin"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / f"{PLUGIN}.py", plugin_dir / f"{PLUGIN}.py")
    baseline = Baseline(reach={m: {} for m in modules})
    started = time.monotonic()
    for index, test_file in enumerate(test_files):
        data_dir = workdir / f"coverage-{index}"
        times = data_dir / "times.json"
        for attempt in (1, 2):  # once more: an integration test may time out on a busy machine
            shutil.rmtree(data_dir, ignore_errors=True)
            data_dir.mkdir(parents=True)
            env = test_env(copy, plugin_dir)
            env["COVERAGE_PROCESS_START"] = str(_rc_file(data_dir, copy, modules, data_dir))
            env["PDPPO_MUTATION_TIMES"] = str(times)
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN]
            cmd += [f"--basetemp={workdir / 'pytest-baseline'}", test_file]
            print(f"  baseline: {test_file} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            done = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True)
            wall = time.monotonic() - t0
            if done.returncode == 0:
                break
            tail = (done.stdout + done.stderr)[-3000:]
            if attempt == 2:
                raise BaselineFailed(f"{test_file} fails on the unmutated copy:\n{tail}")
            print(f"  baseline: {test_file} failed, once more:\n{tail[-600:]}", file=sys.stderr)
        result = json.loads(times.read_text())
        nodeids: list[str] = result["order"]
        baseline.order += nodeids
        baseline.call.update(result["call"])
        baseline.total.update(result["total"])
        baseline.file_of.update({n: test_file for n in nodeids})
        baseline.overhead[test_file] = max(0.0, wall - sum(result["total"].values()))
        owners = {int(pid): set(tests) for pid, tests in result["owners"].items()}
        _charge(
            baseline, copy, data_dir, nodeids=set(nodeids), main_pid=result["pid"], owners=owners
        )
        print(f"  baseline: {test_file} {len(nodeids)} tests, {wall:.0f}s", file=sys.stderr)
    baseline.seconds = time.monotonic() - started
    for module, lines in baseline.reach.items():
        if not lines:  # imports resolved elsewhere (an install, another checkout), or no test
            print(f"  warning: no test ran a line of {copy / module}", file=sys.stderr)
    return baseline


def _charge(
    baseline: Baseline,
    copy: Path,
    data_dir: Path,
    nodeids: set[str],
    main_pid: int,
    owners: dict[int, set[str]],
) -> None:
    """Adds one test file's coverage to `baseline.reach` (see the module's docstring)."""
    at_import: dict[str, set[int]] = {}
    for data_file in sorted(data_dir.glob(".coverage.*")):  # one per measured process
        data = coverage.CoverageData(basename=str(data_file))
        data.read()
        found = DATA_PID.search(data_file.name)
        pid = int(found.group(1)) if found else -1
        seen = owners.get(pid, set())
        owner = seen if pid != main_pid and len(seen) == 1 and "" not in seen else None
        for measured in data.measured_files():
            try:
                module = Path(measured).resolve().relative_to(copy.resolve()).as_posix()
            except ValueError:
                continue
            if module not in baseline.reach:
                continue
            if module not in at_import:
                at_import[module] = import_time_lines((copy / module).read_text())
            for line, contexts in data.contexts_by_lineno(measured).items():
                reached = baseline.reach[module].setdefault(line, set())
                if owner is not None:
                    reached.update(owner)
                elif line in at_import[module]:
                    # run once per process, under whichever test imported the module first;
                    # every other test of the file runs it too, from its own import
                    reached.update(nodeids)
                else:
                    for context in contexts:
                        reached.update(nodeids if context not in nodeids else {context})


def import_time_lines(source: str) -> set[int]:
    """The lines of `source` that run when the module is imported: its top-level statements,
    their decorators, the signatures (defaults) of functions and classes' bodies, all lines of
    each statement but the bodies of the functions within it. A test process imports a module
    once, so coverage records these lines under one test, the first to import it (a `pdppo`
    command imported by the CLI inside a test), although every test of the file depends on them:
    a mutant of one (a decorator removed) must run them all."""
    lines: set[int] = set()
    for statement in ast.parse(source).body:
        decorators = getattr(statement, "decorator_list", [])
        first = min([statement.lineno, *(d.lineno for d in decorators)])
        lines.update(range(first, (statement.end_lineno or statement.lineno) + 1))
        for node in ast.walk(statement):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                # a body sharing the `def` line (`def f(): ...`) leaves that line in: it runs both
                start = max(node.body[0].lineno, node.lineno + 1)
                lines.difference_update(range(start, (node.end_lineno or start) + 1))
    return lines
