"""Mutation testing of the critical modules: how many small deliberate bugs the tests catch.

    python bench/mutation.py                                 # every group, in full
    python bench/mutation.py --modules workers api/deps.py   # a group, a module
    python bench/mutation.py --sample 5 --seed 1             # 5 seeded mutants per module
    python bench/mutation.py --changed origin/main           # groups a change since REF touched
    python bench/mutation.py --list                          # groups, tests, mutant counts
    python bench/mutation.py --modules store-lua             # the store's Lua scripts (a group
                                             # with `lua = true`: bench/mutation_lua.py)
    python bench/mutation.py --modules trust-region --carry run1.json  # after new tests: run
                                             # only what run1.json did not kill, and what is new

Groups, their modules and the tests that guard them, the operators and the reviewed equivalent
mutants are in `bench/mutation.toml`. cosmic-ray (the `mutation` extra) makes and applies the
mutants; the tests run in a copy (`--rev`, HEAD by default, or `--working-tree`), never in this
checkout. A baseline run under coverage finds which tests reach each line, so a mutant runs
only those tests, stopping at the first failure: the tests that killed mutants of the nearest
lines first (`mutation_exec.Killers`), then the quickest. A mutant on a line no test runs is a
survivor without a run ("uncov" column).

Prints, per module: mutants generated (selected operators, outside type annotations), reviewed
equivalent ones subtracted, run, killed, timed out, survived (of which not covered), errors and
the kill rate ((killed + timed out) / scored), then each survivor with the line it changed and
the tests that ran it. Exit status 1 when `--min-kill-rate` is given and not met.
"""

from __future__ import annotations

import argparse
import json
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.mutation_cover import Baseline, BaselineFailed, Copy, make_copy, run_baseline
from bench.mutation_exec import KILLED, TIMEOUT, Killers, Result, run_mutant, say_scored
from bench.mutation_lua import OPERATORS as LUA_OPERATORS
from bench.mutation_plan import (
    Config,
    Group,
    Mutant,
    changed_files,
    describe,
    generate,
    generate_lua,
    load_config,
    sample,
    split_equivalents,
)
from bench.mutation_proc import STOPPING, interrupt_all
from bench.mutation_report import ModuleRun, print_group, print_total, rate, write_json

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_FACTOR = 3.0


def commit_of(root: Path) -> str:
    git = ["git", "-C", str(root), "rev-parse", "--short", "HEAD"]
    return subprocess.run(git, capture_output=True, text=True).stdout.strip()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", metavar="GROUP", help="groups or module paths")
    parser.add_argument("--sample", type=int, metavar="N", help="N seeded mutants per module")
    parser.add_argument("--seed", type=int, default=0, help="sample seed (default 0)")
    parser.add_argument(
        "--changed", metavar="REF", help="modules changed since REF (all of a group's if its tests)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="seconds per mutant (default: from the baseline, which bounds each test too)",
    )
    parser.add_argument("--workers", type=int, default=1, help="mutants at a time, one copy each")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--rev", default="HEAD", help="commit to mutate (default HEAD)")
    where.add_argument(
        "--working-tree", action="store_true", help="mutate a copy of the working tree instead"
    )
    parser.add_argument("--quick", action="store_true", help="each group's quick_tests only")
    parser.add_argument("--budget", type=float, metavar="S", help="start no mutant after S s")
    parser.add_argument("--min-kill-rate", type=float, metavar="R", help="fail below R (0-1)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every result here")
    parser.add_argument(
        "--carry",
        type=Path,
        metavar="PATH",
        help="an earlier run's --json: its kills count again without a run (see below)",
    )
    parser.add_argument("--list", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--config", type=Path, default=REPO / "bench" / "mutation.toml")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.min_kill_rate is not None and not 0 <= args.min_kill_rate <= 1:
        parser.error("--min-kill-rate is a fraction between 0 and 1")
    return args


def selected(config: Config, args: argparse.Namespace) -> list[tuple[Group, set[str] | None]]:
    """(group, the module paths asked for, None for all of the group's) in config order, after
    --modules; --changed is applied to the copy's files (`modules_in`)."""
    wanted: dict[str, set[str] | None] = {}
    for token in args.modules or [g.name for g in config.groups]:
        group = config.group_of(token) or config.group(token)
        if token == group.name:
            wanted[group.name] = None
        elif wanted.get(group.name, set()) is not None:
            wanted[group.name] = {*(wanted.get(group.name) or set()), token}
    return [(g, wanted[g.name]) for g in config.groups if g.name in wanted]


def modules_in(
    root: Path, group: Group, asked: set[str] | None, changed: set[str] | None
) -> list[str]:
    """The group's module patterns (globs: a module split in several stays covered) expanded in
    the copy, then narrowed to what was asked for and what changed (all of them when one of the
    group's test files changed: a weakened test lowers the kill rate of every module it guards)."""
    if changed is not None and changed & set(group.tests):
        changed = None
    found = [
        path.relative_to(root).as_posix()
        for pattern in group.modules
        for path in sorted(root.glob(pattern))
        if path.is_file()
    ]
    unique = list(dict.fromkeys(found))
    return [
        m for m in unique if (asked is None or m in asked) and (changed is None or m in changed)
    ]


def plan_module(
    config: Config,
    copy: Path,
    module: str,
    args: argparse.Namespace,
    lua: bool = False,
    group_modules: tuple[str, ...] = (),
) -> tuple[ModuleRun, list[Mutant]]:
    """The module's mutants (of its Lua bodies with `lua`, whose scripts the `group_modules`
    may run too), less the reviewed equivalent ones, sampled, less what `--carry` already
    killed."""
    if lua:
        mutants, left_out = generate_lua(copy, module, config.lua_operators, group_modules)
    else:
        mutants, left_out = generate(copy, module, config.operators)
    # a Lua group's entries and rules are the Lua operators', a Python group's the others
    entries = tuple(e for e in config.equivalents if (e.operator in LUA_OPERATORS) == lua)
    rules = tuple(r for r in config.rules if (r.operator in LUA_OPERATORS) == lua)
    kept, equivalents, stale = split_equivalents(copy, mutants, entries, rules)
    for entry in stale:
        if entry.file == module:
            print(
                f"stale equivalent entry (matches no mutant): {entry.file}:{entry.line} "
                f"{entry.operator} {entry.code!r} -> {entry.mutant!r}",
                file=sys.stderr,
            )
    todo = sample(kept, args.sample, args.seed, module)
    run = ModuleRun(module, len(mutants), left_out, equivalents, len(todo))
    if args.carry:
        run.results, todo = carried(args.carry, copy, todo)
    return run, todo


CarryKey = tuple[str, str, str, str]  # module, operator, line text, mutated line text


def carried(path: Path, copy: Path, todo: list[Mutant]) -> tuple[list[Result], list[Mutant]]:
    """(the kills of an earlier run's JSON among `todo`, the rest of `todo` to run).

    A mutant is the same one when its module, operator, original line text and mutated line
    text are (line numbers may have moved). Where a module has that text on several lines (the
    same loop in three methods), each earlier kill goes to the one nearest its earlier line:
    the kill of one loop is no proof about another. Sound when the group's tests have only been
    added to since that run (what a round of new tests for its survivors does): a test that
    killed a mutant then still kills it. Survivors, errors and mutants new since then run again."""
    earlier = [
        r
        for module in json.loads(path.read_text())["modules"]
        for r in module["results"]
        if r["outcome"] in (KILLED, TIMEOUT)
    ]
    described = [describe(copy, m) for m in todo]
    same: dict[CarryKey, list[int]] = {}
    for index, m in enumerate(described):
        same.setdefault((m.module, m.short_operator, m.code, m.mutated), []).append(index)
    # nearest pairs first, each earlier result and each mutant in one pair at most
    pairs = sorted(
        (abs(described[i].line - r["line"]), i, j)
        for j, r in enumerate(earlier)
        for i in same.get((r["module"], r["operator"], r["code"], r["mutated"]), [])
    )
    taken: dict[int, dict[str, Any]] = {}
    used: set[int] = set()
    for _, i, j in pairs:
        if i not in taken and j not in used:
            taken[i] = earlier[j]
            used.add(j)
    kept = [
        Result(
            mutant=described[i],
            outcome=r["outcome"],
            seconds=0.0,
            tests=0,
            killer=r.get("killer", ""),
            detail=f"carried from {path.name}",
        )
        for i, r in sorted(taken.items())
    ]
    rest = [mutant for i, mutant in enumerate(todo) if i not in taken]
    if kept:
        print(f"  {todo[0].module}: {len(kept)} kills carried from {path}", file=sys.stderr)
    return kept, rest


def run_group(
    group: Group,
    runs: list[ModuleRun],
    todo: list[Mutant],
    copies: list[Copy],
    baseline: Baseline,
    args: argparse.Namespace,
    deadline: float | None,
    workdir: Path,
    save: Callable[[], None],
) -> dict[str, list[str]]:
    """Runs the group's mutants on the copies, one at a time per copy; returns each mutant's
    reaching tests (for the survivors' lines). `save` runs after every result: a full run of
    an integration group takes hours, and one stopped part way (Ctrl-C, --budget, a session's
    end) keeps what it scored for a later `--carry`."""
    by_module = {run.module: run for run in runs}
    free: queue.Queue[int] = queue.Queue()
    for index in range(len(copies)):
        free.put(index)
    reach = {m.key: reaching(baseline, m) for m in todo}
    killers = Killers()
    for run in runs:
        for earlier in run.results:  # carried
            if earlier.outcome == KILLED:
                killers.add(earlier.mutant.module, earlier.mutant.line, earlier.killer)
    done = [0]

    def one(mutant: Mutant) -> Result | None:
        if STOPPING.is_set() or (deadline is not None and time.monotonic() > deadline):
            return None
        index = free.get()
        try:
            tests = killers.order(mutant, reach[mutant.key])
            timeout = args.timeout or baseline.timeout_for(tests, TIMEOUT_FACTOR)
            each = None if args.timeout else baseline.test_timeouts_for(tests, TIMEOUT_FACTOR)
            basetemp = workdir / f"pytest-{index}"
            root = copies[index].root
            result = run_mutant(
                root,
                mutant,
                tests,
                timeout=timeout,
                basetemp=basetemp,
                confirm=group.confirm_kills,
                test_timeouts=each,
            )
        finally:
            free.put(index)
        if STOPPING.is_set():  # its tests were stopped with the run: the outcome says nothing
            print(
                f"  {mutant.module}:{mutant.line} {mutant.short_operator} stopped, not scored",
                file=sys.stderr,
                flush=True,
            )
            return None
        if result.outcome == KILLED:
            killers.add(mutant.module, mutant.line, result.killer)
        done[0] += 1
        say_scored(result, done[0], len(todo))
        return result

    with ThreadPoolExecutor(max_workers=len(copies)) as pool:
        try:
            # saved as each ends, not in plan order: a stopped run keeps every finished mutant
            for future in as_completed([pool.submit(one, mutant) for mutant in todo]):
                if (result := future.result()) is not None:
                    by_module[result.mutant.module].results.append(result)
                    save()
        except KeyboardInterrupt:  # before the pool's exit, which waits for the running ones
            interrupt_all()  # the queued mutants return at once, the running ones are stopped
            raise
    return reach


def reaching(baseline: Baseline, mutant: Mutant) -> list[str]:
    """The tests that ran the mutant's line, or any of its `anchors` (a Lua mutant's: the lines
    that run its script, in its module and, `foreign`, in the group's others), quickest
    first."""
    lines = mutant.anchors or (mutant.line,)
    places = [(mutant.module, line) for line in lines] + list(mutant.foreign)
    if len(places) == 1:
        return baseline.tests_for(*places[0])
    found = {t for module, line in places for t in baseline.tests_for(module, line)}
    position = {t: i for i, t in enumerate(baseline.order)}
    return sorted(found, key=lambda t: (baseline.call.get(t, 0.0), position.get(t, 0)))


def stop_on_signals() -> None:
    """SIGINT and SIGTERM stop a run as Ctrl-C does (no new mutant, no server left behind,
    what was scored saved). A run started in the background (`cmd &`, nohup) would otherwise
    ignore SIGINT, as the shell starts it with SIGINT ignored, and die at once on SIGTERM."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_signals()
    config = load_config(args.config)
    plan = selected(config, args)
    rev = None if args.working_tree else args.rev
    changed = changed_files(REPO, args.changed, rev) if args.changed else None
    started = time.monotonic()
    deadline = started + args.budget if args.budget else None
    workdir = Path(tempfile.mkdtemp(prefix="pdppo-mutation-"))
    copies: list[Copy] = []
    all_runs: list[ModuleRun] = []
    meta: dict[str, Any] = {"rev": "", "sample": args.sample, "seed": args.seed}

    def save() -> None:
        if args.json:
            write_json(args.json, all_runs, meta)

    failed_baselines: list[str] = []
    stopped = ""
    try:
        for index in range(1 if args.list else args.workers):
            copies.append(make_copy(REPO, workdir / f"copy-{index}", rev))
        root = copies[0].root
        source = "working tree" if rev is None else f"{rev} ({commit_of(root)})"
        meta["rev"] = source
        print(f"mutating a copy of {source} in {workdir}", file=sys.stderr)
        plan_modules = [(g, modules_in(root, g, asked, changed)) for g, asked in plan]
        plan_modules = [(g, modules) for g, modules in plan_modules if modules]
        if not plan_modules:
            print(f"no module under mutation testing, nor its tests, changed since {args.changed}")
            return 0
        for group, modules in plan_modules:
            tests = group.quick_tests if args.quick else group.tests
            present = [t for t in tests if (root / t.split("::", 1)[0]).exists()]
            missing = [t for t in tests if t not in present]
            planned = [
                plan_module(config, root, m, args=args, lua=group.lua, group_modules=tuple(modules))
                for m in modules
            ]
            runs = [run for run, _ in planned]
            todo = [m for _, mutants in planned for m in mutants]
            print(f"\n# {group.name}: {', '.join(modules)}")
            print(f"  tests: {' '.join(present) or '(none)'}")
            if missing:
                print(f"  not in this tree (left out): {' '.join(missing)}")
            if args.list:
                for run in runs:
                    left = ", ".join(f"{n} {why}" for why, n in run.left_out.items())
                    print(
                        f"  {run.module}: {run.generated} mutants, {len(run.equivalents)} "
                        f"equivalent, {run.planned} to run (left out: {left or 'none'})"
                    )
                continue
            if not present:
                print(f"  no test file of group {group.name} exists here: nothing to run")
                continue
            all_runs += runs
            if deadline is not None and time.monotonic() > deadline:
                print("  not run: --budget spent")
                continue
            t0 = time.monotonic()
            try:
                baseline = run_baseline(root, tuple(modules), present, workdir / group.name)
            except BaselineFailed as exc:
                print(f"  baseline failed, group not run: {exc}")
                failed_baselines.append(group.name)
                continue
            reach = run_group(
                group,
                runs,
                todo,
                copies=copies,
                baseline=baseline,
                args=args,
                deadline=deadline,
                workdir=workdir,
                save=save,
            )
            print_group(group.name, runs, reach)
            minutes = (time.monotonic() - t0) / 60
            print(
                f"({group.name}: {minutes:.1f} min, of which baseline "
                f"{baseline.seconds / 60:.1f} min)"
            )
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGINT/SIGTERM (`stop_on_signals`)
        stopped = str(exc) or "SIGINT"
    finally:
        for copy in copies:
            copy.remove()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.list:
        return 0
    detected, scored = print_total(all_runs)
    print(f"({(time.monotonic() - started) / 60:.1f} min in all)")
    save()
    if stopped:
        kept = f"; what it scored is in {args.json}" if args.json else ""
        print(f"stopped by {stopped}{kept}")
        return 130
    if failed_baselines:
        print(f"FAIL: the unmutated tests fail in group(s) {', '.join(failed_baselines)}")
        return 2
    if args.min_kill_rate is not None:
        if not scored:  # a budget spent on the baseline must not pass as a perfect score
            print("FAIL: no mutant was scored (--budget spent before the first one?)")
            return 1
        if detected / scored < args.min_kill_rate:
            print(f"FAIL: kill rate {rate(detected, scored).strip()} < {args.min_kill_rate:.0%}")
            return 1
        print(f"ok: kill rate {rate(detected, scored).strip()} >= {args.min_kill_rate:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
