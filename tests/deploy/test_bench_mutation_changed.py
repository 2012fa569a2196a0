"""bench/mutation_changed.py, CI's mutation of the lines a submission changed, on scratch git
repositories: which lines count as changed (added and modified, not deleted; through a rename;
a Lua line inside a Python string), the base it compares with and its fallback, which tests the
baseline runs and in what order, the fixed order and the budget's cut, the 90% threshold, and
the whole step on a toy module with real cosmic-ray mutants (a kill, a survivor listed with its
tests, lines no test reaches). Needs the `mutation` extra (skipped without it)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest

pytest.importorskip("cosmic_ray")
pytest.importorskip("coverage")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.mutation_changed import (  # noqa: E402
    Dispatched,
    ModulePlan,
    NoBase,
    Turns,
    changed_lines,
    dispatch,
    module_key,
    order_key,
    pick_tests,
    plan_module,
    reaching_by_file,
    record_base,
    resolve_base,
    take_turns,
    verdict,
)
from bench.mutation_exec import KILLED, Result  # noqa: E402
from bench.mutation_plan import Mutant, load_config  # noqa: E402


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def commit(repo: Path, files: dict[str, str | None], message: str = "c") -> str:
    """Writes (or, for None, deletes) `files`, commits them all, returns the commit's hash."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q", "-b", "main")
    for name, text in files.items():
        path = repo / name
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def numbered(prefix: str, count: int) -> str:
    return "".join(f"{prefix}{i} = {i}\n" for i in range(1, count + 1))


LUA_BASE = '''\
_CLAIM = """
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'queued' then return 0 end
return 1
"""


class Store:
    def __init__(self, client: object) -> None:
        self._claim = client.register_script(_CLAIM)

    def claim(self, job: str) -> object:
        return self._claim(keys=[job])
'''
LUA_HEAD = LUA_BASE.replace("if st ~= 'queued' then", "if st ~= 'queued' and st ~= 'paused' then")
CONFIG = """\
[operators]
use = ["NumberReplacer", "ReplaceComparisonOperator_Gt_GtE", "ReplaceBinaryOperator_Add_Sub"]
lua = ["Lua_*"]

[[group]]
name = "store-lua"
lua = true
modules = ["pdppo/store/*.py"]
tests = []
"""


def test_changed_lines_are_the_added_and_modified_ones_through_a_rename_and_in_lua(
    tmp_path: Path,
) -> None:
    """Modified and added lines count, in the new file's numbering; a deleted line, a deleted
    file, a renamed module's unchanged lines, files outside api/ core/ workers/ pdppo/ and
    files that are not Python do not. A changed line of a Lua script held in a string gets
    that line's Lua mutants only."""
    repo = tmp_path / "repo"
    moved = numbered("M", 20)
    base = commit(
        repo,
        {
            "pdppo/a.py": numbered("A", 10),
            "pdppo/moved.py": moved,
            "core/gone.py": "G = 1\n",
            "pdppo/store/s.py": LUA_BASE,
            "docs/x.py": "X = 1\n",
            "tests/test_a.py": "T = 1\n",
            "pdppo/data.txt": "1\n",
        },
    )
    a = numbered("A", 10).splitlines(keepends=True)
    a[2] = "A3 = 4\n"  # modified: line 3
    a[5:5] = ["N1 = 1\n", "N2 = 2\n"]  # added after line 5: lines 6 and 7
    del a[9]  # A8 deleted
    commit(
        repo,
        {
            "pdppo/a.py": "".join(a),
            "pdppo/moved.py": None,
            "pdppo/new/place.py": moved.replace("M12 = 12\n", "M12 = 1200\n"),
            "core/gone.py": None,
            "core/new.py": "B = 1\nC = 2\nD = 3\n",
            "pdppo/store/s.py": LUA_HEAD,
            "docs/x.py": "X = 2\n",
            "tests/test_a.py": "T = 2\n",
            "pdppo/data.txt": "2\n",
        },
    )
    changed = changed_lines(repo, base, "HEAD")
    assert changed == {
        "pdppo/a.py": {3, 6, 7},
        "pdppo/new/place.py": {12},
        "core/new.py": {1, 2, 3},
        "pdppo/store/s.py": {3},
    }
    # the working tree: an uncommitted change counts too, with --working-tree
    (repo / "pdppo/a.py").write_text("".join(a) + "E = 5\n")
    assert changed_lines(repo, base, None)["pdppo/a.py"] == {3, 6, 7, 12}

    (repo / "mutation.toml").write_text(CONFIG)
    config = load_config(repo / "mutation.toml")
    plan = plan_module(repo, config, "pdppo/store/s.py", changed["pdppo/store/s.py"])
    got = sorted((m.line, m.short_operator, m.occurrence) for m in plan.mutants)
    # line 4's `return 1` (Lua_NumberReplacer, occurrence 1) is not a changed line
    assert got == [
        (3, "Lua_And_Or", 0),
        (3, "Lua_NotEq_Eq", 0),
        (3, "Lua_NotEq_Eq", 1),
        (3, "Lua_NumberReplacer", 0),
        (3, "Lua_Remove_EarlyReturn", 0),
    ]
    plan = plan_module(repo, config, "pdppo/a.py", changed["pdppo/a.py"])
    assert sorted({m.line for m in plan.mutants}) == [3, 6, 7]  # NumberReplacer: 4, 1, 2


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """main: c1 - c2 - c3 (HEAD); a side branch from c1: s1."""
    repo = tmp_path_factory.mktemp("history") / "repo"
    c1 = commit(repo, {"pdppo/a.py": numbered("A", 4)})
    c2 = commit(repo, {"pdppo/a.py": numbered("A", 5)})
    git(repo, "checkout", "-q", "-b", "side", c1)
    s1 = commit(repo, {"pdppo/b.py": "B = 1\n"})
    git(repo, "checkout", "-q", "main")
    c3 = commit(repo, {"pdppo/a.py": numbered("A", 6)})
    return {"repo": str(repo), "c1": c1, "c2": c2, "c3": c3, "s1": s1}


@pytest.mark.parametrize(
    ("content", "rev", "warning"),
    [
        ("# the landed main\n{c1}\n", "c1", ""),
        ("{c1}  # trailing words are a comment\n", "c1", ""),
        (None, "c2", ".ci/mutation-base is missing"),
        ("# a comment and nothing else\n", "c2", ".ci/mutation-base names no revision"),
        ("deadbeef\n", "c2", ".ci/mutation-base names deadbeef, which is not a commit"),
        ("{s1}\n", "c2", ".ci/mutation-base names {s1}, which is not an ancestor of HEAD"),
        ("{c3}\n", "c2", ".ci/mutation-base names {c3}, the revision being mutated itself"),
    ],
)
def test_the_base_is_the_recorded_ancestor_else_the_last_commit_with_a_warning(
    history: dict[str, str], tmp_path: Path, content: str | None, rev: str, warning: str
) -> None:
    repo = Path(history["repo"])
    base_file = tmp_path / "mutation-base"
    if content is not None:
        base_file.write_text(content.format(**history))
    # resolve_base reads `repo / base_file`: an absolute base_file is read where it is
    base = resolve_base(repo, "HEAD", None, base_file)
    assert base.rev == history[rev]
    if warning:
        shown = warning.format(**history).replace(".ci/mutation-base", base_file.as_posix())
        assert base.warning.startswith(shown), base.warning
        assert "mutating the lines of the last commit only (HEAD^..HEAD)" in base.warning
        assert changed_lines(repo, base.rev, "HEAD") == {"pdppo/a.py": {6}}  # c3's line
    else:
        assert base.warning == ""
        assert changed_lines(repo, base.rev, "HEAD") == {"pdppo/a.py": {5, 6}}


def test_a_given_base_overrides_the_file_and_no_base_at_all_fails(
    history: dict[str, str], tmp_path: Path
) -> None:
    repo = Path(history["repo"])
    (tmp_path / "base").write_text(f"{history['c1']}\n")
    given = resolve_base(repo, "HEAD", history["c2"][:7], tmp_path / "base")
    assert (given.rev, given.warning) == (history["c2"], "")
    lone = tmp_path / "lone"
    commit(lone, {"pdppo/a.py": "A = 1\n"})
    with pytest.raises(NoBase, match=r"is missing, and HEAD \(\w+\) has no parent in this clone"):
        resolve_base(lone, "HEAD", None, Path(".ci/mutation-base"))


def test_recording_the_base_replaces_the_revision_and_keeps_the_comments(
    history: dict[str, str], tmp_path: Path
) -> None:
    repo = Path(history["repo"])
    base_file = tmp_path / "mutation-base"
    assert record_base(repo, base_file, "HEAD~2") == history["c1"]  # none yet: the header
    assert base_file.read_text().endswith(f"--record-base\n{history['c1']}\n")
    base_file.write_text(f"# ours\n{history['c1']}\n# after\n")
    assert record_base(repo, base_file, "HEAD") == history["c3"]
    assert base_file.read_text() == f"# ours\n# after\n{history['c3']}\n"
    # mutating c2, a base of c3 is no ancestor: the fallback, c2's parent
    assert resolve_base(repo, "HEAD~1", None, base_file).rev == history["c1"]


def test_each_modules_tests_nearest_first(tmp_path: Path) -> None:
    """A module's tests: the files importing it (unit before integration), its group's quick
    tests, then the files further away by imports (through product modules and test helpers);
    tests/browser never. A file two modules share is in both lists (its turn runs it once)."""
    files = {
        "pdppo/__init__.py": "",
        "pdppo/a.py": "X = 1\n",
        "pdppo/b.py": "from .a import X\n",  # a relative import of a
        "pdppo/c.py": "Y = 1\n",
        "pdppo/d.py": "Z = 1\n",
        "tests/unit/test_a.py": "from pdppo.a import X\n",
        "tests/integration/test_a_service.py": "def test_x() -> None:\n    from pdppo import a\n",
        "tests/unit/test_b.py": "import pdppo.b\n",
        "tests/unit/helper.py": "from pdppo.a import X\n",
        "tests/unit/test_helped.py": "from tests.unit.helper import X\n",
        "tests/unit/test_q.py": "Q = 1\n",
        "tests/browser/test_ui.py": "import pdppo.a\n",
        "tests/unit/test_d.py": "import pdppo.d\n",
        "tests/unit/test_d2.py": "from pdppo import d\nfrom pdppo.a import X\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "mutation.toml").write_text(
        '[operators]\nuse = ["NumberReplacer"]\n\n[[group]]\nname = "g"\n'
        'modules = ["pdppo/a.py"]\ntests = ["tests/unit/test_q.py"]\n'
    )
    config = load_config(tmp_path / "mutation.toml")
    picked = pick_tests(tmp_path, config, ["pdppo/a.py", "pdppo/c.py", "pdppo/d.py"])
    assert picked == {
        "pdppo/a.py": [
            ("tests/unit/test_a.py", "imports it"),
            ("tests/unit/test_d2.py", "imports it"),
            ("tests/integration/test_a_service.py", "imports it"),
            ("tests/unit/test_q.py", "quick test of group g"),
            ("tests/unit/test_b.py", "2 imports away"),
            ("tests/unit/test_helped.py", "2 imports away"),
        ],
        "pdppo/c.py": [],
        "pdppo/d.py": [
            ("tests/unit/test_d.py", "imports it"),
            ("tests/unit/test_d2.py", "imports it"),
        ],
    }


def mutant(module: str, line: int, operator: str = "NumberReplacer") -> Mutant:
    return Mutant(module, f"core/{operator}", 0, line, col=4, code="x = 1")


def test_mutants_start_in_a_fixed_order_whatever_order_they_were_made_in() -> None:
    made = [mutant("pdppo/a.py", line) for line in (1, 2, 3)] + [mutant("core/b.py", 7)]
    # sha256 of "pdppo/a.py:3:4:NumberReplacer" starts 647d126a, of line 2's b68ffaa5, of line
    # 1's d4638e2c, of "core/b.py:7:4:NumberReplacer" e800c33b (sha256sum)
    expected = [("pdppo/a.py", 3), ("pdppo/a.py", 2), ("pdppo/a.py", 1), ("core/b.py", 7)]
    for todo in (made, made[::-1], made[2:] + made[:2]):
        assert [(m.module, m.line) for m in sorted(todo, key=order_key)] == expected


def test_modules_take_their_turns_in_a_fixed_order_of_their_paths() -> None:
    # sha256 of "pdppo/two.py" starts 449115e3, of "pdppo/one.py" 49c92c29, of
    # "pdppo/first.py" 80a373c2, of "pdppo/second.py" d5d9f717 (sha256sum)
    expected = ["pdppo/two.py", "pdppo/one.py", "pdppo/first.py", "pdppo/second.py"]
    for names in (sorted(expected), expected[::-1], expected):
        assert sorted(names, key=module_key) == expected


@pytest.mark.parametrize(
    ("deadline", "ran"),
    [(35.0, 4), (30.0, 3), (29.9, 3), (60.0, 6)],  # one at 30 s: none starts at the deadline
)
def test_the_budget_runs_the_beginning_of_the_order(deadline: float, ran: int) -> None:
    todo = [mutant("pdppo/a.py", line) for line in range(1, 7)]
    now = [0.0]

    def run(m: Mutant) -> Result:
        now[0] += 10.0  # each mutant takes 10 s
        return Result(m, KILLED, 10.0, 1, killer="t", detail="")

    def no_stop() -> None:
        raise AssertionError("nothing was running at the deadline")

    got = dispatch(todo, 1, run, deadline, clock=lambda: now[0], stop=no_stop)
    assert [r.mutant for r in got.results] == todo[:ran]
    assert got.not_started == todo[ran:]
    assert got.stopped == []


def test_a_mutant_running_at_the_deadline_is_stopped_and_not_scored() -> None:
    todo = [mutant("pdppo/a.py", line) for line in (1, 2)]
    release = threading.Event()

    def run(m: Mutant) -> Result:
        release.wait(30)
        return Result(
            m, KILLED, 0.0, 1, killer="t", detail=""
        )  # what an interrupted test run looks like

    got = dispatch(todo, 1, run, time.monotonic() + 0.5, stop=release.set)
    assert (got.results, got.stopped, got.not_started) == ([], todo[:1], todo[1:])


class Clocked:
    """take_turns' collaborators on a clock of their own: each test file takes its seconds
    (cut at the `stop_at` it is given), each mutant 10 s, killed by any measured file that
    reaches its line. The log says what ran, in order."""

    def __init__(self, seconds: dict[str, float], reaches: dict[str, set[tuple[str, int]]]) -> None:
        self.now = 0.0
        self.seconds = seconds
        self.reaches = reaches
        self.measured: list[str] = []
        self.log: list[str] = []

    def clock(self) -> float:
        return self.now

    def measure(self, test: str, stop_at: float) -> str:
        if self.now + self.seconds[test] > stop_at:
            self.now = stop_at
            self.log.append(f"stopped {test} at {stop_at:g}")
            return "stopped at its time limit"
        self.now += self.seconds[test]
        self.measured.append(test)
        self.log.append(f"measured {test}")
        return ""

    def reach(self, m: Mutant) -> list[str]:
        return [t for t in self.measured if (m.module, m.line) in self.reaches.get(t, set())]

    def run(self, todo: list[Mutant], deadline: float) -> Dispatched:
        def one(m: Mutant) -> Result:
            self.now += 10.0
            self.log.append(f"ran {m.module}:{m.line}")
            return Result(m, KILLED, 10.0, 1, killer="t", detail="")

        def no_stop() -> None:
            raise AssertionError("a fake mutant ends before the clock is read")

        return dispatch(todo, 1, one, deadline, clock=self.clock, stop=no_stop)

    def turns(
        self,
        plans: list[ModulePlan],
        tests: dict[str, list[str]],
        budget: float,
        cap: float = 60.0,
        share: float = 0.5,
    ) -> Turns:
        return take_turns(
            plans,
            tests,
            measure=self.measure,
            reach=self.reach,
            run=self.run,
            deadline=budget,
            cap=cap,
            share=share,
            clock=self.clock,
            say=lambda line: None,
        )


def plan(module: str, *lines: int) -> ModulePlan:
    return ModulePlan(module, set(lines), [mutant(module, line) for line in lines], [])


@pytest.mark.parametrize(
    ("cap", "measured"),
    [(40.0, ["a1", "a2"]), (39.9, ["a1", "a2"]), (40.1, ["a1", "a2", "a3"]), (0.0, ["a1"])],
)
def test_a_modules_baseline_starts_no_file_past_its_cap_and_runs_its_mutants_next(
    cap: float, measured: list[str]
) -> None:
    """Files of 20 s: the third starts at 40 s, so only under a cap over 40 s; the first starts
    whatever the cap. A file a module's turn ran (a1) is not run again for the next module."""
    fake = Clocked(dict.fromkeys(["a1", "a2", "a3", "b1"], 20.0), {"a1": {("a", 1), ("b", 1)}})
    tests = {"a": ["a1", "a2", "a3"], "b": ["a1", "b1"]}
    turns = fake.turns([plan("a", 1), plan("b", 1)], tests, budget=1000.0, cap=cap)
    assert fake.log == [
        *(f"measured {t}" for t in measured),
        "ran a:1",
        "measured b1",
        "ran b:1",
    ]
    assert turns.had_turn == ["a", "b"]
    assert turns.tried == {**dict.fromkeys(measured, ""), "b1": ""}
    assert [r.mutant.key for r in turns.results] == [
        "a:1:4:NumberReplacer:0",
        "b:1:4:NumberReplacer:0",
    ]
    assert (turns.not_started, turns.stopped, turns.unknown, turns.uncovered) == ([], [], {}, [])
    assert not turns.budget_spent


def test_the_budget_leaves_the_first_modules_in_full_and_part_of_the_next() -> None:
    """a: a1 (0-10 s), its 3 mutants (10-40 s); b: b1 (40-50 s), two of its 3 mutants (50-70 s:
    the second starts at 60 s, before the 65 s deadline); c never has its turn."""
    reaches = {"a1": {("a", n) for n in (1, 2, 3)}, "b1": {("b", n) for n in (1, 2, 3)}}
    fake = Clocked({"a1": 10.0, "b1": 10.0, "c1": 10.0}, reaches)
    plans = [plan("a", 1, 2, 3), plan("b", 1, 2, 3), plan("c", 1, 2)]
    turns = fake.turns(plans, {"a": ["a1"], "b": ["b1"], "c": ["c1"]}, budget=65.0)
    assert turns.had_turn == ["a", "b"]
    assert [(r.mutant.module, r.mutant.line) for r in turns.results] == [
        (m.module, m.line) for m in sorted(plans[0].mutants, key=order_key)
    ] + [(m.module, m.line) for m in sorted(plans[1].mutants, key=order_key)[:2]]
    assert turns.not_started == sorted(plans[1].mutants, key=order_key)[2:] + sorted(
        plans[2].mutants, key=order_key
    )
    assert "measured c1" not in fake.log
    assert turns.budget_spent


def test_a_first_file_longer_than_the_budget_is_stopped_at_its_share_and_the_next_module_runs() -> (
    None
):
    """A module's first file would take 1000 s of a 480 s budget: it is stopped at 240 s (half
    of what was left), its mutants are not known (not scored, not survivors), and the next
    module's turn scores its own."""
    fake = Clocked({"a1": 1000.0, "a2": 5.0, "b1": 10.0}, {"b1": {("b", 1)}})
    turns = fake.turns([plan("a", 1), plan("b", 1)], {"a": ["a1", "a2"], "b": ["b1"]}, 480.0)
    assert fake.log == ["stopped a1 at 240", "measured b1", "ran b:1", "measured a2"]
    assert turns.tried == {"a1": "stopped at its time limit", "b1": "", "a2": ""}
    assert [r.mutant.key for r in turns.results] == ["b:1:4:NumberReplacer:0"]
    assert turns.unknown == {"a": [mutant("a", 1)]}  # a2 does not reach it; a1 might
    assert turns.uncovered == []


def test_mutants_no_measured_file_reaches_wait_for_a_second_turn_with_the_rest_of_the_files() -> (
    None
):
    """A cap of 5 s runs a's first file only; its line 2, which only a2 reaches, waits while b
    has its turn, then a's second turn runs a2 and the mutant. With no time left for that
    turn, it stays unknown."""
    reaches = {"a1": {("a", 1)}, "a2": {("a", 2)}, "b1": {("b", 1)}}
    tests = {"a": ["a1", "a2"], "b": ["b1"]}
    plans = [plan("a", 1, 2), plan("b", 1)]
    fake = Clocked(dict.fromkeys(["a1", "a2", "b1"], 10.0), reaches)
    turns = fake.turns(plans, tests, budget=100.0, cap=5.0)
    assert fake.log == [
        "measured a1",
        "ran a:1",
        "measured b1",
        "ran b:1",
        "measured a2",
        "ran a:2",
    ]
    assert turns.had_turn == ["a", "b"]
    assert (turns.unknown, turns.not_started, turns.budget_spent) == ({}, [], False)
    cut = Clocked(dict.fromkeys(["a1", "a2", "b1"], 10.0), reaches)
    turns = cut.turns(plans, tests, budget=40.0, cap=5.0)
    assert cut.log == fake.log[:4]
    assert turns.unknown == {"a": [mutant("a", 2)]}
    assert turns.budget_spent


def test_a_line_none_of_its_modules_files_reaches_is_not_covered_with_the_reason() -> None:
    fake = Clocked({"a1": 10.0}, {"a1": {("a", 1)}})
    turns = fake.turns([plan("a", 1, 2), plan("z", 3)], {"a": ["a1"], "z": []}, budget=100.0)
    assert [r.mutant.line for r in turns.results] == [1]
    assert turns.uncovered == [
        (mutant("a", 2), "none of the 1 test files run for a reaches it"),
        (mutant("z", 3), "no test file imports z, nor lists it in a group of bench/mutation.toml"),
    ]


@pytest.mark.parametrize(
    ("detected", "scored", "passes"),
    [
        (9, 10, True),  # at 90%
        (27, 30, True),  # at 90%: exact fractions, no rounding decides it
        (8, 9, False),  # 88.9%, just under
        (89, 100, False),
        (91, 100, True),  # just over
        (10, 10, True),
        (0, 0, False),  # nothing scored is no pass
    ],
)
def test_the_threshold_is_90_percent_of_what_ran(detected: int, scored: int, passes: bool) -> None:
    assert verdict(detected, scored, Fraction("0.9")) is passes


def test_a_survivors_tests_are_named_by_file_and_counted_past_twelve() -> None:
    few = ["t/a.py::x[1]", "t/a.py::x[2]", "t/a.py::y", "t/b.py::z"]
    assert reaching_by_file(few) == "t/a.py: x (2 cases), y; t/b.py: z"
    many = [f"t/a.py::x[{i}]" for i in range(12)] + ["t/b.py::z"]
    assert reaching_by_file(many[:12]) == "t/a.py: x (12 cases)"
    assert reaching_by_file(many) == "t/a.py (12 tests); t/b.py (1 test)"


TOY_BASE = """\
from __future__ import annotations


def clamp(x: int, low: int = 0) -> int:
    return max(x, low)


def total(a: int, b: int) -> int:
    return sum((a, b))
"""
TOY_TOTAL = TOY_BASE.replace("return sum((a, b))", "return a + b")
TOY_HEAD = TOY_TOTAL.replace("return max(x, low)", "return x if x > low else low") + (
    "\n\ndef unused(a: int) -> int:\n    return a + 1\n"
)
TOY_TESTS = """\
from pdppo.toy import clamp, total


def test_clamp_keeps_what_is_above_the_floor() -> None:
    assert clamp(5) == 5
    assert clamp(-3) == 0


def test_total_adds() -> None:
    assert total(2, 3) == 5
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """c1: the toy; c2: `total` rewritten with a `+`; c3 (HEAD): `clamp` with a `>`, `unused`
    added, and .ci/mutation-base naming c1."""
    repo = tmp_path_factory.mktemp("toy") / "repo"
    c1 = commit(
        repo,
        {
            "pdppo/__init__.py": "",
            "pdppo/toy.py": TOY_BASE,
            "tests/test_toy.py": TOY_TESTS,
            "mutation.toml": CONFIG,
        },
    )
    c2 = commit(repo, {"pdppo/toy.py": TOY_TOTAL})
    commit(repo, {"pdppo/toy.py": TOY_HEAD, ".ci/mutation-base": f"# landed\n{c1}\n"})
    return {"repo": str(repo), "c1": c1, "c2": c2}


def step(repo: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The tool's main on the toy repository, as .ci/mutation runs it; stdout and stderr."""
    code = "import sys; from pathlib import Path; import bench.mutation_changed as m\n"
    code += f"m.REPO = Path({repo!r})\nsys.exit(m.main(sys.argv[1:]))\n"
    return subprocess.run(
        [sys.executable, "-c", code, "--config", f"{repo}/mutation.toml", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_step_fails_below_90_percent_and_lists_each_survivor_with_its_tests(
    toy: dict[str, str],
) -> None:
    """Since c1: `total`'s `+` (killed), `clamp`'s `>` (no test at the floor: survives, with
    the test that ran it), and `unused`'s three (no test calls it: not covered). 1 of 5."""
    done = step(toy["repo"])
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert f"changed since {toy['c1'][:7]} (.ci/mutation-base)" in out
    assert "ran 5 of 5 mutants in 1 of 1 modules\n" in out
    assert (
        "survivors (4):\n"
        "  pdppo/toy.py:5  ReplaceComparisonOperator_Gt_GtE\n"
        "      - return x if x > low else low\n"
        "      + return x if x >= low else low\n"
        "      ran by 1 tests, none failed: "
        "tests/test_toy.py: test_clamp_keeps_what_is_above_the_floor\n"
        "  pdppo/toy.py:13  ReplaceBinaryOperator_Add_Sub\n"
        "      - return a + 1\n"
        "      + return a - 1\n"
        "      not covered: none of the 1 test files run for pdppo/toy.py reaches it\n"
    ) in out
    assert out.count("not covered: none of the 1 test files") == 3
    assert "FAIL: kill rate 20.0% (1 of 5) < 90%" in out


def test_the_step_passes_at_100_percent(toy: dict[str, str]) -> None:
    done = step(toy["repo"], "--rev", toy["c2"], "--base", toy["c1"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ran 1 of 1 mutants in 1 of 1 modules\n" in done.stdout
    assert "ok: kill rate 100.0% (1 of 1) >= 90%" in done.stdout


def test_a_budget_spent_before_any_mutant_fails_and_says_so(toy: dict[str, str]) -> None:
    done = step(toy["repo"], "--budget", "0")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "baseline: tests/test_toy.py" not in done.stdout + done.stderr
    assert (
        "ran 0 of 5 mutants in 0 of 1 modules (budget 0s; modules in the order of sha256(path), "
        "their mutants in that of sha256(file:line:col:operator): 5 not started, "
        "0 stopped at the budget, 0 not reached by the test files measured)\n"
        "  no turn (the budget ended before it), 1: pdppo/toy.py (5)\n"
    ) in done.stdout
    assert "FAIL: none of the 5 mutants was scored (the budget was spent)" in done.stdout


def test_a_missing_base_file_mutates_the_last_commit_and_says_why(
    toy: dict[str, str], tmp_path: Path
) -> None:
    done = step(toy["repo"], "--list", "--base-file", str(tmp_path / "none"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"WARNING: {tmp_path / 'none'} is missing: mutating the lines")
    # c2..c3: clamp's line and unused's (not total's, changed in c2)
    assert "4 mutants on them" in done.stdout
    assert f"changed since {toy['c2'][:7]} (HEAD^, the fallback)" in done.stdout


SLOW = """\
from __future__ import annotations


def bump(x: int) -> int:
    return x + 1
"""
SLOW_TESTS = {
    "tests/test_bump.py": "from pdppo.slow import bump\n\n\ndef test_bump() -> None:\n"
    "    assert bump(1) == 2\n",
    # reaches the same line, after ten minutes: a test file that outlasts any share of the budget
    "tests/test_bump_slowly.py": "import time\n\nfrom pdppo.slow import bump\n\n\n"
    "def test_bump_slowly() -> None:\n    time.sleep(600)\n    assert bump(2) == 3\n",
}


def test_a_test_file_that_outlasts_its_share_is_stopped_and_the_mutants_run(
    tmp_path: Path,
) -> None:
    """The baseline must not eat the budget: with every file run first, the slow file started
    at once and ran past the budget, and nothing was scored ("FAIL: none of the 3 mutants was
    scored"). Its module's turn stops it at its share of the budget (a quarter of 120 s here),
    and the three mutants of `x + 1` run against the file that was measured, and are killed.
    The 90 s left are for a shared machine: with half of a 40 s budget left, 2 of the 3 ran
    on 2 cores at a load of 6."""
    repo = tmp_path / "repo"
    c1 = commit(repo, {"pdppo/__init__.py": "", "pdppo/slow.py": "", "mutation.toml": CONFIG})
    commit(repo, {"pdppo/slow.py": SLOW, **SLOW_TESTS})
    done = step(str(repo), "--base", c1, "--budget", "120", "--baseline-share", "0.25")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "baseline left out tests/test_bump_slowly.py: stopped at its time limit\n" in out
    assert "ran 3 of 3 mutants in 1 of 1 modules\n" in out
    assert (
        "  pdppo/slow.py: its mutants ran against the 1 of its 2 test files measured "
        "(1 stopped at its time limit)\n"
    ) in out
    assert "ok: kill rate 100.0% (3 of 3) >= 90%" in out


FIRST = """\
from __future__ import annotations


def add(a: int, b: int) -> int:
    return a + b


def above(x: int) -> bool:
    return x > 2
"""
SECOND = """\
from __future__ import annotations


def succ(x: int) -> int:
    return x + 1
"""
TURN_TESTS = {
    "tests/test_first_above.py": "from pdppo.first import above\n\n\ndef test_above() -> None:\n"
    "    assert above(3)\n    assert not above(2)\n",
    "tests/test_first_add.py": "from pdppo.first import add\n\n\ndef test_add() -> None:\n"
    "    assert add(2, 3) == 5\n",
    "tests/test_second.py": "from pdppo.second import succ\n\n\ndef test_succ() -> None:\n"
    "    assert succ(1) == 2\n",
}


def test_modules_take_turns_and_a_capped_module_finishes_in_a_second_turn(tmp_path: Path) -> None:
    """first.py (sha256 80a373c2) before second.py (d5d9f717). With a cap of 0 s each turn
    measures one file: first.py's nearest, test_first_above.py, serves `above`'s three
    mutants; `add`'s one waits, not scored, while second.py has its turn; then first.py's second
    turn measures test_first_add.py and runs it. 7 of 7 in 2 of 2 modules."""
    repo = tmp_path / "repo"
    files = {"pdppo/__init__.py": "", "pdppo/first.py": "", "pdppo/second.py": ""}
    c1 = commit(repo, {**files, "mutation.toml": CONFIG})
    commit(repo, {"pdppo/first.py": FIRST, "pdppo/second.py": SECOND, **TURN_TESTS})
    done = step(str(repo), "--base", c1, "--module-baseline", "0", "--budget", "600")
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, out + err
    turns = [
        "\nturn of pdppo/first.py: 4 mutants, 0 of its 2 test files measured; "
        "none but its first file starts after 0s\n",
        "\nturn of pdppo/second.py: 3 mutants, 0 of its 1 test files measured; "
        "none but its first file starts after 0s\n",
        "\nsecond turn of pdppo/first.py: 1 mutants, 1 of its 2 test files measured; ",
    ]
    assert all(turn in out for turn in turns), out
    assert [out.index(turn) for turn in turns] == sorted(out.index(turn) for turn in turns)
    measured = [line for line in err.splitlines() if line.endswith(" ...")]
    assert measured == [
        "  baseline: tests/test_first_above.py ...",
        "  baseline: tests/test_second.py ...",
        "  baseline: tests/test_first_add.py ...",
    ]
    assert "[7/7] pdppo/first.py:5 ReplaceBinaryOperator_Add_Sub killed by " in err
    assert "ran 7 of 7 mutants in 2 of 2 modules\n" in out
    assert "ok: kill rate 100.0% (7 of 7) >= 90%" in out


def test_mutants_only_a_failing_file_could_reach_are_named_and_not_a_failure(
    tmp_path: Path,
) -> None:
    """The module's one test file fails unmutated (the test step fails the run for it): no
    coverage says which test reaches its two mutants, so they are named, not scored, and the
    budget was not spent on nothing: no failure here."""
    repo = tmp_path / "repo"
    c1 = commit(repo, {"pdppo/__init__.py": "", "pdppo/bad.py": "", "mutation.toml": CONFIG})
    commit(
        repo,
        {
            "pdppo/bad.py": "def one() -> int:\n    return 1\n",
            "tests/test_bad.py": "from pdppo.bad import one\n\n\ndef test_one() -> None:\n"
            "    assert one() == 2\n",
        },
    )
    done = step(str(repo), "--base", c1, "--budget", "600")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "baseline left out tests/test_bad.py: fails unmutated (pytest exit 1)\n" in out
    assert (
        "ran 0 of 2 mutants in 0 of 1 modules (budget 600s; modules in the order of "
        "sha256(path), their mutants in that of sha256(file:line:col:operator): 0 not started, "
        "0 stopped at the budget, 2 not reached by the test files measured)\n"
        "  pdppo/bad.py: its mutants ran against the 0 of its 1 test files measured "
        "(1 fails unmutated (pytest exit 1))\n"
        "      2 not reached by those, not scored: line 2\n"
    ) in out
    assert "ok: none of the 2 mutants was scored: no test file measured reaches them" in out
