"""bench/mutation_lua.py on a toy module that embeds Lua as the store does: the mutants it makes
(known input, known mutants), what it leaves alone (docstrings, Lua strings and comments,
subscripts, a return that is not an early exit), and a Lua mutant through the same baseline and
per-mutant run as a Python one. Needs the `mutation` extra (skipped without it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("cosmic_ray")
pytest.importorskip("coverage")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.mutation import reaching  # noqa: E402
from bench.mutation_cover import Baseline, run_baseline  # noqa: E402
from bench.mutation_exec import KILLED, SURVIVED, run_mutant  # noqa: E402
from bench.mutation_lua import mutate_source, sites  # noqa: E402
from bench.mutation_plan import (  # noqa: E402
    Equivalent,
    Mutant,
    describe,
    generate,
    generate_lua,
    load_config,
    split_equivalents,
)

ALL = ("Lua_*",)
TOY = '''\
"""A docstring that mentions redis.call('GET', k) == 1 and is not Lua."""

NOT_LUA = "a == b and not c"

_CLAIM = """
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'queued' and st ~= 'running' then return 0 end
if not redis.call('HGET', KEYS[1], 'x') or st == 'a == b' then return 'no' end
-- a comment: st == 1 and 2 < 3
if tonumber(ARGV[2]) >= 3 then redis.call('HINCRBY', KEYS[1], 'n', 1) end
return 1
"""


def fenced(lease: int) -> str:
    return (
        f"if ARGV[1] ~= '' and redis.call('GET', KEYS[{lease}]) ~= ARGV[1] then "
        f"return -1 end\\n"
    )


class Store:
    def __init__(self, client: object) -> None:
        self._claim = client.register_script(_CLAIM)

    def claim(self, job: str) -> object:
        return self._claim(keys=[job])
'''
TEST = """\
from toy import Store


class Client:  # runs no Lua: answers whether the script still says what the test expects
    def register_script(self, script):
        return lambda keys: "st ~= 'queued' and st ~= 'running'" in script


def test_claim_takes_queued_and_running_jobs_only() -> None:
    assert Store(Client()).claim("j1")
"""


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    (tmp_path / "toy.py").write_text(TOY)
    (tmp_path / "test_toy.py").write_text(TEST)
    return tmp_path


def mutated(root: Path) -> list[tuple[int, str, str]]:
    mutants, left_out = generate_lua(root, "toy.py", ALL)
    assert left_out == {}
    return [(m.line, m.short_operator, describe(root, m).mutated) for m in mutants]


def test_known_lua_gives_known_mutants(toy: Path) -> None:
    assert mutated(toy) == [
        (7, "Lua_NotEq_Eq", "if st == 'queued' and st ~= 'running' then return 0 end"),
        (7, "Lua_And_Or", "if st ~= 'queued' or st ~= 'running' then return 0 end"),
        (7, "Lua_NotEq_Eq", "if st ~= 'queued' and st == 'running' then return 0 end"),
        (7, "Lua_Remove_EarlyReturn", "if st ~= 'queued' and st ~= 'running' then  end"),
        (7, "Lua_NumberReplacer", "if st ~= 'queued' and st ~= 'running' then return 1 end"),
        (8, "Lua_Delete_Not", "if redis.call('HGET', KEYS[1], 'x') or st == 'a == b' then "
            "return 'no' end"),
        (8, "Lua_Or_And", "if not redis.call('HGET', KEYS[1], 'x') and st == 'a == b' then "
            "return 'no' end"),
        (8, "Lua_Eq_NotEq", "if not redis.call('HGET', KEYS[1], 'x') or st ~= 'a == b' then "
            "return 'no' end"),
        (8, "Lua_Remove_EarlyReturn", "if not redis.call('HGET', KEYS[1], 'x') or "
            "st == 'a == b' then  end"),
        (10, "Lua_GtE_Gt", "if tonumber(ARGV[2]) > 3 then redis.call('HINCRBY', KEYS[1], "
            "'n', 1) end"),
        (10, "Lua_NumberReplacer", "if tonumber(ARGV[2]) >= 4 then redis.call('HINCRBY', "
            "KEYS[1], 'n', 1) end"),
        (10, "Lua_NumberReplacer", "if tonumber(ARGV[2]) >= 3 then redis.call('HINCRBY', "
            "KEYS[1], 'n', 0) end"),
        (11, "Lua_NumberReplacer", "return 0"),
        (17, "Lua_NotEq_Eq", """f"if ARGV[1] == '' and redis.call('GET', KEYS[{lease}]) ~= """
            """ARGV[1] then \""""),
        (17, "Lua_And_Or", """f"if ARGV[1] ~= '' or redis.call('GET', KEYS[{lease}]) ~= """
            """ARGV[1] then \""""),
        (17, "Lua_NotEq_Eq", """f"if ARGV[1] ~= '' and redis.call('GET', KEYS[{lease}]) == """
            """ARGV[1] then \""""),
        # the fence's early return is in the second literal of the concatenation
        (18, "Lua_Remove_EarlyReturn", 'f" end\\n"'),
        (18, "Lua_NumberReplacer", 'f"return -0 end\\n"'),
    ]  # fmt: skip


def test_what_is_not_a_site(toy: Path) -> None:
    """The docstring, a Python string without `redis.call(`, the Lua strings ('a == b') and
    comment, the subscripts (KEYS[1], ARGV[2]) and the script's last `return 1` (no `if`: it is
    the script's answer, mutated as a number only) give no mutant."""
    lines = {line for line, _, _ in mutated(toy)}
    assert lines == {7, 8, 10, 11, 17, 18}
    source = TOY
    for site in sites(source, ["Lua_NumberReplacer"]):
        assert source[site.start - 1] != "[", source[site.start - 5 : site.end + 5]
    assert [source[s.start : s.end] for s in sites(source, ["Lua_Remove_EarlyReturn"])] == [
        "return 0",
        "return 'no'",
        "return -1",
    ]


def test_a_mutant_is_the_module_with_one_lua_body_changed(toy: Path) -> None:
    """The mutated module still imports (it is Python with one string changed) and holds the
    changed Lua. A mutant's anchors are where its script runs: the line calling what
    `register_script` made of `_CLAIM`; the fence, which nothing here registers, is anchored at
    the statement holding it."""
    mutants, _ = generate_lua(toy, "toy.py", ALL)
    anchors = {m.line: m.anchors for m in mutants}
    assert anchors == {7: (27,), 8: (27,), 10: (27,), 11: (27,), 17: (16,), 18: (16,)}
    first = mutants[0]
    source = mutate_source(TOY, first.operator, first.occurrence)
    assert source is not None
    namespace: dict[str, object] = {}
    exec(compile(source, "toy.py", "exec"), namespace)
    assert "if st == 'queued' and st ~= 'running' then return 0 end" in str(namespace["_CLAIM"])
    assert mutate_source(TOY, first.operator, 99) is None


def test_lua_equivalent_entries_match_by_operator_name(toy: Path) -> None:
    mutants, _ = generate_lua(toy, "toy.py", ALL)
    entry = Equivalent(
        file="toy.py", line=10, operator="Lua_GtE_Gt",
        code="if tonumber(ARGV[2]) >= 3 then redis.call('HINCRBY', KEYS[1], 'n', 1) end",
        mutant="if tonumber(ARGV[2]) > 3 then redis.call('HINCRBY', KEYS[1], 'n', 1) end",
        reason="a reason",
    )  # fmt: skip
    kept, matched, stale = split_equivalents(toy, mutants, (entry,))
    assert [(m.line, m.short_operator) for m, _ in matched] == [(10, "Lua_GtE_Gt")]
    assert stale == [] and len(kept) == len(mutants) - 1


def test_python_mutants_of_a_module_with_lua_are_unchanged(toy: Path) -> None:
    """cosmic-ray's side sees one string constant per Lua body, as before: no Lua mutant."""
    mutants, _ = generate(toy, "toy.py", ("ReplaceComparisonOperator_NotEq_Eq", "NumberReplacer"))
    assert mutants == []


def test_a_lua_mutant_runs_the_tests_that_import_its_module(
    toy: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("work")
    baseline = run_baseline(toy, ("toy.py",), ["test_toy.py"], work)
    mutants, _ = generate_lua(toy, "toy.py", ALL)
    test = ["test_toy.py::test_claim_takes_queued_and_running_jobs_only"]

    def outcome(line: int, operator: str) -> str:
        mutant = next(m for m in mutants if (m.line, m.short_operator) == (line, operator))
        tests = baseline.tests_for("toy.py", *mutant.anchors)
        assert tests == test
        return run_mutant(toy, mutant, tests, 120, work / "t", confirm=True).outcome

    assert outcome(7, "Lua_And_Or") == KILLED
    assert outcome(10, "Lua_GtE_Gt") == SURVIVED
    assert (toy / "toy.py").read_text() == TOY  # put back


def test_the_shipped_config_has_a_lua_group_over_the_store_scripts(tmp_path: Path) -> None:
    config = load_config(ROOT / "bench" / "mutation.toml")
    lua = [g for g in config.groups if g.lua]
    assert [g.name for g in lua] == ["store-lua"]
    assert config.lua_operators == ("Lua_*",)
    for module in lua[0].modules:
        mutants, _ = generate_lua(ROOT, module, config.lua_operators)
        assert mutants, module  # every module of the group embeds Lua
    shipped = (ROOT / "bench" / "mutation.toml").read_text()
    (tmp_path / "bad.toml").write_text(shipped.replace('lua = ["Lua_*"]', 'lua = ["Lua_Nope"]'))
    with pytest.raises(SystemExit, match="'Lua_Nope' matches no Lua operator"):
        load_config(tmp_path / "bad.toml")


def test_a_mutant_with_several_anchors_runs_the_tests_of_each_quickest_first() -> None:
    """A body two methods register (deletion's `_USERS`, in three scripts) is reached by the
    tests of every calling line, each once."""
    baseline = Baseline(
        order=["t::a", "t::b", "t::c", "t::d"],
        call={"t::a": 3.0, "t::b": 1.0, "t::c": 2.0, "t::d": 0.5},
        reach={"m.py": {10: {"t::a", "t::b"}, 20: {"t::b", "t::c"}, 30: {"t::d"}}},
    )
    lua = Mutant(
        module="m.py",
        operator="lua/Lua_Eq_NotEq",
        occurrence=0,
        line=5,
        col=0,
        code="x",
        anchors=(10, 20),
    )
    assert reaching(baseline, lua) == ["t::b", "t::c", "t::a"]
    python = Mutant(
        module="m.py", operator="core/NumberReplacer", occurrence=0, line=30, col=0, code="y"
    )  # no anchors: its own line
    assert reaching(baseline, python) == ["t::d"]


OTHER = """\
from toy import _CLAIM as CLAIM, fenced

_FENCED_CLAIM = fenced(2) + CLAIM


class Api:
    def __init__(self, client: object) -> None:
        self._take = client.register_script(_FENCED_CLAIM)

    def take(self, job: str) -> object:
        return self._take(keys=[job])
"""


def test_a_script_another_module_of_the_group_runs_is_reached_there_too(toy: Path) -> None:
    """`other.py` registers toy's `_CLAIM` (renamed, behind toy's fence) and runs it at its line
    11: each mutant of either body has that line as a `foreign` anchor, whose tests it runs too
    (as the store's `_FINISH`, which `AsyncJobStore.fail` registers). Without the group's other
    modules, none."""
    (toy / "other.py").write_text(OTHER)
    mutants, _ = generate_lua(toy, "toy.py", ALL, ("toy.py", "other.py"))
    assert {m.line: m.foreign for m in mutants} == {
        **dict.fromkeys((7, 8, 10, 11, 17, 18), (("other.py", 11),)),
    }
    assert {m.anchors for m in mutants} == {(27,), (16,)}  # its own, as before
    alone, _ = generate_lua(toy, "toy.py", ALL)
    assert {m.foreign for m in alone} == {()}
    baseline = Baseline(
        order=["t::own", "t::other"],
        call={"t::own": 2.0, "t::other": 1.0},
        reach={"toy.py": {27: {"t::own"}}, "other.py": {11: {"t::other"}}},
    )
    claim = next(m for m in mutants if m.line == 7)
    assert reaching(baseline, claim) == ["t::other", "t::own"]
