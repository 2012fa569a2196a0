"""bench/mutation.py's parts on a toy project: the mutants it makes and leaves out, the reviewed
equivalents it subtracts, the baseline that says which test reaches which line, and a mutant
killed or surviving for the right reason. Needs the `mutation` extra (skipped without it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("cosmic_ray")
pytest.importorskip("coverage")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.mutation_cover import import_time_lines, run_baseline  # noqa: E402
from bench.mutation_exec import (  # noqa: E402
    KILLED,
    NOT_COVERED,
    SURVIVED,
    TIMEOUT,
    Killers,
    run_mutant,
)
from bench.mutation_plan import (  # noqa: E402
    Equivalent,
    EquivalentRule,
    Mutant,
    describe,
    generate,
    load_config,
    sample,
    split_equivalents,
)

OPERATORS = ("ReplaceComparisonOperator_Gt_GtE", "ReplaceBinaryOperator_Add_Sub", "NumberReplacer")
TOY = """\
from __future__ import annotations

PAGE_SIZE = 1000
RETRIES = 3


def clamp(x: int | None, low: int = 0) -> int:
    if x is None:
        return low
    return x if x > low else low


def total(a: int, b: int) -> int:
    return a + b


def unused(a: int) -> int:
    return a + 1
"""
TESTS = """\
from toy import clamp, total


def test_clamp_keeps_what_is_above_the_floor() -> None:
    assert clamp(5) == 5
    assert clamp(-3) == 0


def test_total_adds() -> None:
    assert total(2, 3) == 5
"""


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    (tmp_path / "toy.py").write_text(TOY)
    (tmp_path / "test_toy.py").write_text(TESTS)
    return tmp_path


def test_mutants_leave_out_annotations_and_tuning_constants(toy: Path) -> None:
    mutants, left_out = generate(toy, "toy.py", OPERATORS)
    # `int | None` has no mutant here (BitOr is not selected), but the defaults and constants do:
    # PAGE_SIZE = 1000 is a tuning constant (both +-1 left out), RETRIES = 3 is not.
    assert left_out == {"tuning constants": 2}
    found = {(m.line, m.short_operator) for m in mutants}
    assert found == {
        (4, "NumberReplacer"),  # RETRIES = 3
        (7, "NumberReplacer"),  # low: int = 0
        (10, "ReplaceComparisonOperator_Gt_GtE"),
        (14, "ReplaceBinaryOperator_Add_Sub"),
        (18, "ReplaceBinaryOperator_Add_Sub"),
        (18, "NumberReplacer"),
    }
    assert len(mutants) == 9  # NumberReplacer: +1 and -1 each
    gt = next(m for m in mutants if m.line == 10)
    assert gt.code == "return x if x > low else low"
    assert describe(toy, gt).mutated == "return x if x >= low else low"


def test_annotations_and_signature_markers_are_not_mutated(toy: Path) -> None:
    _, left_out = generate(toy, "toy.py", ("ReplaceBinaryOperator_BitOr_BitAnd",))
    assert left_out == {"in annotations": 1}  # `x: int | None`
    (toy / "sig.py").write_text("def f(a, *, b):\n    return a * b\n")
    mutants, left_out = generate(toy, "sig.py", ("ReplaceBinaryOperator_Mul_Div",))
    assert left_out == {"signature markers": 1}  # the bare `*`, not a multiplication
    assert [(m.line, describe(toy, m).mutated) for m in mutants] == [(2, "return a / b")]


def test_equivalents_are_subtracted_and_stale_entries_reported(toy: Path) -> None:
    mutants, _ = generate(toy, "toy.py", OPERATORS)
    entry = Equivalent(
        file="toy.py", line=10, operator="ReplaceComparisonOperator_Gt_GtE",
        code="return x if x > low else low", mutant="return x if x >= low else low",
        reason="x == low returns low either way",
    )  # fmt: skip
    stale = Equivalent(
        file="toy.py",
        line=99,
        operator="NumberReplacer",
        code="gone()",
        mutant="gone( 1)",
        reason="moved away",
    )
    kept, matched, unmatched = split_equivalents(toy, mutants, (entry, stale))
    assert [(m.line, e.reason) for m, e in matched] == [(10, "x == low returns low either way")]
    assert unmatched == [stale]
    assert len(kept) == len(mutants) - 1


def test_a_rule_subtracts_the_mutants_its_context_names_and_no_others(toy: Path) -> None:
    """A rule matches the operator, a file glob and the line around the mutation's start (`@`):
    here the `+ 1` of `unused`, not the `+` of `total` nor any number of another file."""
    mutants, _ = generate(toy, "toy.py", OPERATORS)
    rule = EquivalentRule(
        "plus-one", ("toy*.py",), "ReplaceBinaryOperator_Add_Sub", r"a @\+ 1$", "never called"
    )
    elsewhere = EquivalentRule("other", ("core/*.py",), "NumberReplacer", "@", "not this file")
    kept, matched, unmatched = split_equivalents(toy, mutants, (), (rule, elsewhere))
    assert [(m.line, m.mutated, e.reason) for m, e in matched] == [
        (18, "return a - 1", "[plus-one] never called")
    ]
    assert unmatched == [] and len(kept) == len(mutants) - 1
    # an entry takes precedence over a rule for the same mutant: its reason is the one shown
    entry = Equivalent(
        file="toy.py",
        line=18,
        operator="ReplaceBinaryOperator_Add_Sub",
        code="return a + 1",
        mutant="return a - 1",
        reason="dead code",
    )
    _, matched, _ = split_equivalents(toy, mutants, (entry,), (rule,))
    assert [e.reason for _, e in matched] == ["dead code"]


def test_carry_counts_an_earlier_runs_kills_and_runs_the_rest(toy: Path, tmp_path: Path) -> None:
    """`--carry`: a mutant the earlier run killed (same module, operator, line text and mutated
    text, wherever the line moved) is scored with its outcome, without a run; its survivors and
    the mutants it never saw run again."""
    from bench.mutation import carried

    mutants, _ = generate(toy, "toy.py", OPERATORS)
    adds = [
        describe(toy, m)
        for m in mutants
        if m.line in (14, 18) and m.short_operator == "ReplaceBinaryOperator_Add_Sub"
    ]
    assert [m.mutated for m in adds] == ["return a - b", "return a - 1"]

    def record(m: Mutant, outcome: str) -> dict[str, object]:
        fields = ("module", "line", "operator", "code", "mutated")
        values = (m.module, m.line + 40, m.short_operator, m.code, m.mutated)
        return {**dict(zip(fields, values, strict=True)), "outcome": outcome, "killer": "t::k"}

    earlier = tmp_path / "earlier.json"
    results = [record(adds[0], "killed"), record(adds[1], "survived")]
    earlier.write_text(json.dumps({"modules": [{"module": "toy.py", "results": results}]}))
    kept, rest = carried(earlier, toy, mutants)
    assert [(r.mutant.line, r.outcome, r.seconds, r.killer) for r in kept] == [
        (14, "killed", 0.0, "t::k")  # its killer kept: this run's `Killers` start from it
    ]
    assert len(rest) == len(mutants) - 1 and all(m.line != 14 for m in rest)


def test_carry_gives_a_kill_to_the_same_text_nearest_its_earlier_line(tmp_path: Path) -> None:
    """The same loop in three methods makes three mutants of one text; an earlier run that
    killed only the third's (the lines since moved down 2) proves nothing about the others."""
    from bench.mutation import carried

    body = "def {name}(xs: list[int]) -> int:\n    for x in list(xs):\n        print(x)\n"
    body += "    return 0\n"
    toy = "\n\n".join(body.format(name=name) for name in ("a", "b", "c"))
    (tmp_path / "loops.py").write_text(toy)
    mutants, _ = generate(tmp_path, "loops.py", ("ZeroIterationForLoop",))
    loops = [describe(tmp_path, m) for m in mutants]
    assert [m.line for m in loops] == [2, 8, 14]
    third = loops[2]
    record = {
        "module": third.module,
        "line": third.line - 2,
        "operator": third.short_operator,
        "code": third.code,
        "mutated": third.mutated,
        "outcome": "killed",
        "killer": "t::k",
    }
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"modules": [{"module": "loops.py", "results": [record]}]}))
    kept, rest = carried(earlier, tmp_path, mutants)
    assert [(r.mutant.line, r.outcome) for r in kept] == [(14, "killed")]
    assert [m.line for m in rest] == [2, 8]


def test_a_mutants_tests_run_the_nearest_lines_killers_first(toy: Path) -> None:
    """Only the order changes: every reaching test is still run, and a killer that does not
    reach the mutant's line is not added."""
    mutants, _ = generate(toy, "toy.py", OPERATORS)
    mutant = next(m for m in mutants if m.line == 10)
    tests = ["t::quick", "t::near", "t::far", "t::slow"]
    killers = Killers()
    assert killers.order(mutant, tests) == tests  # nothing known: the quickest first
    killers.add("toy.py", 2, "t::far")
    killers.add("toy.py", 11, "t::near")
    killers.add("toy.py", 10, "t::elsewhere")  # reaches other lines only
    killers.add("other.py", 10, "t::slow")  # another module's
    killers.add("toy.py", 10, "(an import at collection)")
    assert killers.order(mutant, tests) == ["t::near", "t::far", "t::quick", "t::slow"]


def test_sample_is_seeded_per_module(toy: Path) -> None:
    mutants, _ = generate(toy, "toy.py", OPERATORS)
    first = sample(mutants, 3, seed=7, module="toy.py")
    assert first == sample(mutants, 3, seed=7, module="toy.py")
    assert len(first) == 3 and set(first) <= set(mutants)
    assert sample(mutants, None, seed=7, module="toy.py") == mutants


def test_baseline_reach_and_mutant_outcomes(
    toy: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("work")
    baseline = run_baseline(toy, ("toy.py",), ["test_toy.py"], work)
    clamp_test = "test_toy.py::test_clamp_keeps_what_is_above_the_floor"
    assert baseline.tests_for("toy.py", 10) == [clamp_test]
    assert baseline.tests_for("toy.py", 14) == ["test_toy.py::test_total_adds"]
    assert baseline.tests_for("toy.py", 18) == []  # `unused` is never called
    # module-level lines run at import, which no single test owns: charged to both
    assert len(baseline.tests_for("toy.py", 4)) == 2

    mutants, _ = generate(toy, "toy.py", OPERATORS)
    by_line = {(m.line, m.short_operator, m.occurrence): m for m in mutants}

    def outcome(line: int, operator: str, occurrence: int = 0) -> str:
        mutant = by_line[(line, operator, occurrence)]
        tests = baseline.tests_for("toy.py", line)
        return run_mutant(toy, mutant, tests, 120, work / "t", confirm=True).outcome

    assert outcome(14, "ReplaceBinaryOperator_Add_Sub") == KILLED  # total(2, 3) == -1
    # clamp(5), clamp(-3): neither is at the floor, so `>=` cannot be told from `>`
    assert outcome(10, "ReplaceComparisonOperator_Gt_GtE") == SURVIVED
    assert outcome(18, "ReplaceBinaryOperator_Add_Sub", 1) == NOT_COVERED
    assert (toy / "toy.py").read_text() == TOY  # every mutant was put back


LATE = """\
import functools

LIMIT = 3


@functools.lru_cache(maxsize=8)
def double(
    x: int,
    scale: int = 2,
) -> int:
    \"\"\"Its body runs when called.\"\"\"
    return x * scale


class Box:
    SIZE = LIMIT + 1

    @staticmethod
    def fits(n: int) -> bool:
        return n <= Box.SIZE
"""
# Both tests import `late` inside the test, as a CLI test imports a command through the CLI:
# the first to run imports it, and coverage records its import-time lines under that test only.
LATE_TESTS = """\
def test_double() -> None:
    import late

    assert late.double(4) == 8


def test_box() -> None:
    import late

    assert late.Box.fits(4)
"""


def test_import_time_lines_are_statements_decorators_signatures_and_class_bodies() -> None:
    # the decorator, the signature over 4 lines, the class and its body, not the two bodies
    assert import_time_lines(LATE) == {1, 3, 6, 7, 8, 9, 10, 15, 16, 17, 18, 19}
    assert import_time_lines("def f(): return 1\n") == {1}  # the body shares the def's line


def test_import_time_lines_of_a_module_imported_inside_a_test_are_every_tests(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A mutant of an import-time line (a decorator removed, a default changed) must run every
    test of the file: the test that imported the module first is not the only one that needs
    it, and it may not be the one that tells the mutant."""
    (tmp_path / "late.py").write_text(LATE)
    (tmp_path / "test_late.py").write_text(LATE_TESTS)
    work = tmp_path_factory.mktemp("work")
    baseline = run_baseline(tmp_path, ("late.py",), ["test_late.py"], work)
    both = ["test_late.py::test_double", "test_late.py::test_box"]
    for line in (3, 6, 7, 9, 15, 16, 18, 19):  # constant, decorator, def, default, class body
        assert sorted(baseline.tests_for("late.py", line)) == sorted(both), line
    assert baseline.tests_for("late.py", 12) == ["test_late.py::test_double"]  # a body
    assert baseline.tests_for("late.py", 20) == ["test_late.py::test_box"]


def test_a_mutant_that_breaks_an_import_is_killed(tmp_path: Path) -> None:
    """A module-level constant whose mutant makes the module fail to import: pytest cannot
    collect the test file, so the node ids it was given are not found (exit status 4, a usage
    error). That is the mutant's doing, a kill, not the tool's."""
    (tmp_path / "floor.py").write_text(
        "import math\n\nFLOOR = 1e-30\nLOG_FLOOR = math.log(FLOOR)\n"
    )
    (tmp_path / "test_floor.py").write_text(
        "from floor import LOG_FLOOR\n\n\ndef test_floor() -> None:\n    assert LOG_FLOOR < -60\n"
    )
    mutants, _ = generate(tmp_path, "floor.py", ("NumberReplacer",))
    negative = next(m for m in mutants if describe(tmp_path, m).mutated == "FLOOR = -1.0")
    test = ["test_floor.py::test_floor"]
    result = run_mutant(tmp_path, negative, test, 120, tmp_path / "t", confirm=False)
    assert (result.outcome, result.killer) == (KILLED, "(an import at collection)")


def test_the_shipped_config_names_real_operators_and_existing_modules() -> None:
    config = load_config(ROOT / "bench" / "mutation.toml")
    assert {g.name for g in config.groups} == {
        "trust-region",
        "workers",
        "worker-outages",
        "progress",
        "ranks",
        "auth",
        "store",
        "store-lua",
        "sse",
        "routes",
        "uploads",
        "client",
        "commands",
        "graders",
        "rollout",
        "rollout-server",
        "evaluation",
        "training-run",
        "openai",
        "webhooks",
        "experiments",
        "tracking",
        "sampling",
        "hf-final",
        "corrections",
    }
    for group in config.groups:
        assert any(any(ROOT.glob(p)) for p in group.modules), group.name  # globs
        # quick tests are files of the group's or node ids in them, which exist
        for quick in group.quick_tests:
            path, _, node = quick.partition("::")
            assert path in group.tests, (group.name, quick)
            assert not node or f"def {node.split('[')[0]}(" in (ROOT / path).read_text(), quick

    # every rule names existing modules and matches some mutant in them (the first module with
    # a match settles it: the frozen rule names most of the tree)
    def matches_in(rule: EquivalentRule, module: Path) -> bool:
        mutants, _ = generate(ROOT, str(module.relative_to(ROOT)), config.operators)
        return bool(split_equivalents(ROOT, mutants, (), (rule,))[1])

    for rule in config.rules:
        modules = [p for f in rule.files for p in sorted(ROOT.glob(f))]
        assert modules, rule.name
        assert any(matches_in(rule, module) for module in modules), rule.name


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_background_run_stops_on_sigint_and_sigterm_as_on_ctrl_c(sig: signal.Signals) -> None:
    """A shell starts `cmd &` with SIGINT ignored: without its own handlers, a background run
    could not be stopped cleanly (SIGTERM would kill it with its servers left running)."""
    waits = "import bench.mutation as m, time\nm.stop_on_signals()\ntry:\n"
    waits += "    print('ready', flush=True)\n    time.sleep(60)\n"
    waits += "except KeyboardInterrupt as e:\n    print('stopped', e)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", waits],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (0, f"stopped {sig.name}\n")


def test_a_mutant_that_hangs_one_test_is_a_timeout_after_that_tests_bound(tmp_path: Path) -> None:
    """Each test has its own bound (pytest-timeout, set by `mutation_bounds` over the test's own
    timeout mark), so a hang costs that test's bound rather than the whole run's or a slower
    test's; it is scored as a timeout, naming the test, and not run again."""
    (tmp_path / "hang.py").write_text(
        "def countdown(n: int) -> int:\n    while n > 0:\n        n = n - 1\n    return n\n"
    )
    (tmp_path / "test_hang.py").write_text(
        "from pathlib import Path\n\nimport pytest\n\nfrom hang import countdown\n\n\n"
        "def test_quick() -> None:\n    assert countdown(0) == 0\n\n\n"
        "@pytest.mark.timeout(100)\n"
        "def test_countdown() -> None:\n"
        "    with Path('runs').open('a') as runs:\n        runs.write('run ')\n"
        "    assert countdown(3) == 0\n"
    )
    [mutant], _ = generate(tmp_path, "hang.py", ("ReplaceBinaryOperator_Sub_Add",))
    tests = ["test_hang.py::test_quick", "test_hang.py::test_countdown"]
    bounds = {tests[0]: 100.0, tests[1]: 3.0}
    result = run_mutant(
        tmp_path,
        mutant,
        tests,
        timeout=120,
        basetemp=tmp_path / "t",
        confirm=True,
        test_timeouts=bounds,
    )
    assert (result.outcome, result.killer) == (TIMEOUT, tests[1])
    assert result.seconds < 60  # its own 3 s bound: not its mark's 100 s, the other's, the run's
    assert (tmp_path / "runs").read_text() == "run "  # and no confirming rerun


def test_a_mutants_bounds_come_from_its_tests_baseline_times() -> None:
    """The run: 3x the tests' time, plus their files' slowest start-up, plus a minute; each
    test: 3x its own time, plus the same start-up and minute."""
    from bench.mutation_cover import Baseline

    times = Baseline(total={"a": 1.0, "b": 5.0}, file_of={"a": "f", "b": "g"})
    times.overhead = {"f": 2.0, "g": 4.0}
    assert times.timeout_for(["a", "b"], 3.0) == 3 * 6 + 4 + 60
    assert times.test_timeouts_for(["a", "b"], 3.0) == {"a": 3 * 1 + 4 + 60, "b": 3 * 5 + 4 + 60}
    assert times.test_timeouts_for(["a"], 3.0) == {"a": 3 * 1 + 2 + 60}


def test_a_stopped_run_keeps_each_mutant_that_finished_and_says_it_stopped(tmp_path: Path) -> None:
    """The whole command on a toy repository, two mutants at once: one hangs its test (its bound
    over 84 s: 3x the test's 8 s baseline, plus a minute), the other is killed at once. SIGTERM
    after the kill: the kill is in the --json (it ended after a mutant planned before it started,
    which holds none back), the hang stopped, and the command says it stopped and exits 130.
    The hanging test's own 8 s give the kill 80 s to be scored before the hang's bound could
    end it too: on a loaded machine the baseline and the kill took over 50 s."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "spin.py").write_text(
        "def countdown(n: int) -> int:\n    while n > 0:\n        n = n - 1\n    return n\n\n\n"
        "def later(n: int) -> int:\n    return n + 1\n"
    )
    (repo / "test_spin.py").write_text(
        "import time\n\nfrom spin import countdown, later\n\n\n"
        "def test_countdown() -> None:\n    time.sleep(8)\n    assert countdown(3) == 0\n\n\n"
        "def test_later() -> None:\n    assert later(1) == 2\n"
    )
    (repo / "mutation.toml").write_text(
        '[operators]\nuse = ["ReplaceBinaryOperator_Sub_Add", "ReplaceBinaryOperator_Add_Sub"]\n\n'
        '[[group]]\nname = "spin"\nmodules = ["spin.py"]\ntests = ["test_spin.py"]\n'
    )
    for git in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "toy"],
    ):
        subprocess.run(["git", "-C", str(repo), *git], check=True)
    results = tmp_path / "run.json"
    run = "import sys; from pathlib import Path; import bench.mutation as m\n"
    run += f"m.REPO = Path({str(repo)!r})\nsys.exit(m.main(sys.argv[1:]))\n"
    args = ["--config", str(repo / "mutation.toml"), "--workers", "2", "--json", str(results)]
    proc = subprocess.Popen(
        [sys.executable, "-c", run, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def scored() -> list[dict[str, object]]:
        if not results.exists():
            return []
        return [r for m in json.loads(results.read_text())["modules"] for r in m["results"]]

    try:
        deadline = time.monotonic() + 80  # the hang's bound is over 84 s
        while not scored() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert [(r["line"], r["outcome"]) for r in scored()] == [(8, KILLED)]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failed assertion above: the run still stops what it started
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    assert proc.returncode == 130, out
    assert f"stopped by SIGTERM; what it scored is in {results}" in out
    assert [(r["line"], r["outcome"]) for r in scored()] == [(8, KILLED)]
    # The hang's tests, stopped with the run, fail: not a kill, and not reported as one.
    assert "spin.py:3 ReplaceBinaryOperator_Sub_Add stopped, not scored" in out, out
    assert not [line for line in out.splitlines() if "spin.py:3" in line and "killed" in line]


def test_a_dotted_exception_name_is_left_out_and_every_other_is_made(tmp_path: Path) -> None:
    """cosmic-ray's ExceptionReplacer raised AttributeError applying itself to
    `importlib.metadata.PackageNotFoundError`, and stopped the changed-lines step with a
    traceback; the plain names beside it, before and after, are still mutated."""
    (tmp_path / "m.py").write_text(
        "import importlib.metadata\n\n\ndef major() -> int:\n    try:\n"
        '        return int(importlib.metadata.version("x").split(".")[0])\n'
        "    except (OSError, importlib.metadata.PackageNotFoundError, ValueError):\n"
        "        return 0\n"
    )
    mutants, left_out = generate(tmp_path, "m.py", ("ExceptionReplacer",))
    assert left_out == {"dotted exception names": 1}
    assert [describe(tmp_path, m).mutated for m in mutants] == [
        "except (CosmicRayTestingException, importlib.metadata.PackageNotFoundError, ValueError):",
        "except (OSError, importlib.metadata.PackageNotFoundError, CosmicRayTestingException):",
    ]
