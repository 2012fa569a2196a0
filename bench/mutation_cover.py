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

from bench.mutation_proc import run_command

HERE = Path(__file__).resolve().parent
PLUGIN = "mutation_contexts"
# pytest plugins no test uses, whose import every test process pays (hypothesis's: 1.6 s of CPU
# of about 6 for tests/workers/test_outage_log.py on a loaded 2-core machine); a test with
# @given still runs without it
UNUSED_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
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
    left_out: dict[str, str] = field(default_factory=dict)  # test file -> why it did not run
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


class BaselineRunner:
    """Runs test files into one `Baseline`, one at a time, whenever a caller asks: the
    changed-lines step measures each module's files when its turn comes, not all of them first.
    Every file measures all of `modules`, so a file run for one module serves the others."""

    def __init__(
        self, copy: Path, modules: tuple[str, ...], workdir: Path, skip_failing: bool = False
    ) -> None:
        self.copy = copy
        self.modules = modules
        self.workdir = workdir
        self.skip_failing = skip_failing
        self.plugin_dir = workdir / "plugin"
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / f"{PLUGIN}.py", self.plugin_dir / f"{PLUGIN}.py")
        self.baseline = Baseline(reach={m: {} for m in modules})
        self.measured: list[str] = []  # the files whose coverage is in, in the order they ran
        self._runs = 0

    def run(self, test_file: str, stop_at: float | None = None) -> str:
        """Runs `test_file` under coverage and adds what it reached; "" then, else why it is
        left out (also in `baseline.left_out`). With `stop_at` (time.monotonic()), a file still
        running then is stopped, nothing it started left behind, and left out. A file that
        fails is run once more (an integration test may time out on a busy machine); failing
        twice it raises `BaselineFailed`, or with `skip_failing` is left out: the changed-lines
        step needs coverage only, and the test step is the one that fails a run on it."""
        began = time.monotonic()
        try:
            return self._run(test_file, stop_at)
        finally:
            self.baseline.seconds += time.monotonic() - began

    def _run(self, test_file: str, stop_at: float | None) -> str:
        baseline = self.baseline
        baseline.left_out.pop(test_file, None)  # one stopped at an earlier limit, run again
        self._runs += 1
        data_dir = self.workdir / f"coverage-{self._runs}"
        times = data_dir / "times.json"
        code: int | None = None
        wall = 0.0
        for attempt in (1, 2):
            if attempt == 2 and stop_at is not None and time.monotonic() >= stop_at:
                break
            shutil.rmtree(data_dir, ignore_errors=True)
            data_dir.mkdir(parents=True)
            env = test_env(self.copy, self.plugin_dir)
            rc = _rc_file(data_dir, self.copy, self.modules, data_dir)
            env["COVERAGE_PROCESS_START"] = str(rc)
            env["PDPPO_MUTATION_TIMES"] = str(times)
            cmd = [sys.executable, "-m", "pytest", "-q", *UNUSED_PLUGINS, "-p", PLUGIN]
            cmd += [f"--basetemp={self.workdir / 'pytest-baseline'}", test_file]
            print(f"  baseline: {test_file} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            left = None if stop_at is None else max(0.0, stop_at - t0)
            code, out = run_command(cmd, self.copy, env, left)
            wall = time.monotonic() - t0
            if code is None:
                why = "stopped at its time limit"
                print(f"  baseline: {test_file} {why}, {wall:.0f}s", file=sys.stderr, flush=True)
                baseline.left_out[test_file] = why
                return why
            if code == 0:
                break
            tail = out[-3000:]
            if attempt == 2 and not self.skip_failing:
                raise BaselineFailed(f"{test_file} fails on the unmutated copy:\n{tail}")
            again = "left out" if attempt == 2 else "once more"
            print(f"  baseline: {test_file} failed, {again}:\n{tail[-600:]}", file=sys.stderr)
        if code != 0:
            if not self.skip_failing:
                raise BaselineFailed(f"{test_file} fails on the unmutated copy (no time to rerun)")
            why = f"fails unmutated (pytest exit {code})"
            baseline.left_out[test_file] = why
            return why
        result = json.loads(times.read_text())
        nodeids: list[str] = result["order"]
        baseline.order += nodeids
        baseline.call.update(result["call"])
        baseline.total.update(result["total"])
        baseline.file_of.update({n: test_file for n in nodeids})
        baseline.overhead[test_file] = max(0.0, wall - sum(result["total"].values()))
        owners = {int(pid): set(tests) for pid, tests in result["owners"].items()}
        _charge(
            baseline,
            self.copy,
            data_dir,
            nodeids=set(nodeids),
            main_pid=result["pid"],
            owners=owners,
        )
        self.measured.append(test_file)
        print(f"  baseline: {test_file} {len(nodeids)} tests, {wall:.0f}s", file=sys.stderr)
        return ""


def run_baseline(
    copy: Path,
    modules: tuple[str, ...],
    test_files: list[str],
    workdir: Path,
    deadline: float | None = None,
    skip_failing: bool = False,
) -> Baseline:
    """Runs each test file unmutated under coverage (`BaselineRunner.run`); raises
    `BaselineFailed` if any test fails, unless `skip_failing`. With `deadline`
    (time.monotonic()), no file starts after it: the files left are in `left_out`, and the lines
    only they reach are not known."""
    runner = BaselineRunner(copy, modules, workdir, skip_failing)
    started = time.monotonic()
    for test_file in test_files:
        if deadline is not None and time.monotonic() > deadline:
            runner.baseline.left_out[test_file] = "budget"
            continue
        runner.run(test_file)
    runner.baseline.seconds = time.monotonic() - started
    for module, lines in runner.baseline.reach.items():
        if not lines:  # imports resolved elsewhere (an install, another checkout), or no test
            print(f"  warning: no test ran a line of {copy / module}", file=sys.stderr)
    return runner.baseline


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
