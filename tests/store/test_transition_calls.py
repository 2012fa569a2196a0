"""Each script's typed call (`pdppo.store.jobs.transitions`) builds KEYS and ARGV in the order its
Lua reads them: every field is given a value of its own, and the lists are spelled out here, so a
swapped pair of keys or arguments fails its row. Every script has a row, and each call gives its
script exactly as many KEYS and ARGV as the Lua reads (a variadic tail aside).

A unit test of the calls alone; `tests/store/test_transitions.py` runs the same calls against a
real redis-server, every state x every request."""

# ruff: noqa: E501 (one call a row: the table reads as a table)

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from pdppo.store.jobs import transitions as t

J = "pdppo:job:J"
ACTIVE = "pdppo:tenant:T:active"


class Call(NamedTuple):
    call: Any
    script: str
    keys: list[str]
    args: list[object]


# fmt: off
CALLS: list[Call] = [
    Call(
        t.Create(job_id="J", tenant="T", idempotency_key="IDEM", max_active=2, idempotency_ttl=60,
                 status_data="SD", check_at=5.5, fields={"a": "1", "b": "2"}),
        t.CREATE,
        [J, f"{J}:events", "pdppo:tenant:T:jobs", ACTIVE, "IDEM", "pdppo:outbox", "pdppo:webhooks:feed"],
        ["J", 2, 60, "SD", 5.5, "a", "1", "b", "2"],
    ),
    Call(
        t.Claim(job_id="J", now="NOW", worker="W", status_data="SD", phase="PH"),
        t.CLAIM,
        [J, f"{J}:events", "pdppo:running", "pdppo:outbox", "pdppo:webhooks:feed"],
        ["J", "NOW", "W", "SD", "PH"],
    ),
    Call(
        t.PublishStep(job_id="J", step=3, now="NOW", metrics="M", event="E", row="R", lease_token="TOK"),
        t.PUBLISH_STEP,
        [J, f"{J}:events", f"{J}:metrics", f"{J}:lease"],
        [3, "NOW", "M", "E", "R", "TOK"],
    ),
    Call(
        t.PublishResult(job_id="J", rows_key="ROWS", step=3, now="NOW", event="E", row="R",
                        step_field="SF", event_type="ET", keep=7, lease_token="TOK", what="W"),
        t.PUBLISH_RESULT,
        [J, f"{J}:events", "ROWS", f"{J}:lease"],
        [3, "NOW", "E", "R", "SF", "ET", 7, "TOK"],
    ),
    Call(
        t.PublishCheckpoint(job_id="J", step=3, now="NOW", event="E", lease_token="TOK"),
        t.PUBLISH_CHECKPOINT,
        [J, f"{J}:events", f"{J}:lease", "pdppo:webhooks:feed"],
        [3, "NOW", "E", "TOK"],
    ),
    Call(
        t.PublishPhase(job_id="J", name="N", phase="PH", event="E", at="AT", lease_token="TOK"),
        t.PUBLISH_PHASE,
        [J, f"{J}:events", f"{J}:lease"],
        ["PH", "E", "AT", "TOK"],
    ),
    Call(
        t.PublishTrackers(job_id="J", runs="RUNS", lease_token="TOK"),
        t.PUBLISH_TRACKERS,
        [J, f"{J}:lease"],
        ["RUNS", "TOK"],
    ),
    Call(
        t.AddLogOnce(job_id="J", type="TY", data="D", window=200, lease_token="TOK"),
        t.ADD_LOG_ONCE,
        [f"{J}:events", f"{J}:lease"],
        ["TY", "D", 200, "TOK"],
    ),
    Call(
        t.BeginPause(job_id="J", lease_token="TOK"),
        t.BEGIN_PAUSE,
        [J, f"{J}:lease"],
        ["TOK"],
    ),
    Call(
        t.Finish(job_id="J", tenant="T", status="ST", now="NOW", status_data="SD", done_data="DD",
                 fields={"error_code": "C", "error_message": "M"}),
        t.FINISH,
        [J, f"{J}:events", ACTIVE, "pdppo:running", "pdppo:outbox", "pdppo:stats", "pdppo:webhooks:feed"],
        ["J", "ST", "NOW", "SD", "DD", "error_code", "C", "error_message", "M"],
    ),
    Call(
        t.Requeue(job_id="J", tenant="T", now="NOW", queued_data="QD", log_data="LD",
                  cancelled_data="CD", cancelled_done_data="CDD", lease_token="TOK",
                  max_worker_losses=4, failed_data="FD", failed_done_data="FDD",
                  failure_message="FM", check_at=5.5, paused_data="PD", paused_log_data="PLD",
                  stall_gap_ms=1000, stall_hold_ms=2000),
        t.REQUEUE,
        [J, f"{J}:events", f"{J}:lease", "pdppo:running", ACTIVE, "pdppo:outbox", "pdppo:stats",
         "pdppo:webhooks:feed", "pdppo:clock", "pdppo:clock:stall"],
        ["J", "NOW", "QD", "LD", "CD", "CDD", "TOK", 4, "FD", "FDD", "FM", 5.5, "PD", "PLD", 1000, 2000],
    ),
    Call(
        t.Cancel(job_id="J", tenant="T", now="NOW", status_data="SD", done_data="DD", log_data="LD"),
        t.CANCEL,
        [J, f"{J}:events", ACTIVE, "pdppo:running", "pdppo:outbox", "pdppo:stats", "pdppo:webhooks:feed"],
        ["J", "NOW", "SD", "DD", "LD"],
    ),
    Call(
        t.Pause(job_id="J", now="NOW", paused_data="PD", log_data="LD"),
        t.PAUSE,
        [J, f"{J}:events", "pdppo:outbox", "pdppo:webhooks:feed"],
        ["NOW", "PD", "LD"],
    ),
    Call(
        t.Resume(job_id="J", tenant="T", now="NOW", queued_data="QD", check_at=5.5,
                 withdrawn_log_data="WLD", max_active=2, storage_log_data="SLD",
                 stopping_log_data="STLD"),
        t.RESUME,
        [J, f"{J}:events", "pdppo:outbox", ACTIVE, "pdppo:webhooks:feed"],
        ["NOW", "QD", 5.5, "WLD", 2, "SLD", "STLD"],
    ),
    Call(
        t.Patch(job_id="J", base_version=3, overrides="O", now="NOW", total_steps=20,
                log_data="LD", expected_versions="1 2"),
        t.PATCH,
        [J, f"{J}:events"],
        [3, "O", "NOW", 20, "LD", "1 2"],
    ),
    Call(
        t.Announce(job_id="J", version=3, event="E", lease_token="TOK"),
        t.ANNOUNCE,
        [J, f"{J}:events", f"{J}:lease"],
        [3, "E", "TOK"],
    ),
    Call(
        t.DeleteJob(job_id="J", tenant="T", now=5.5),
        t.DELETE_JOB,
        [J, f"{J}:events", f"{J}:metrics", f"{J}:eval", f"{J}:samples", f"{J}:lease",
         "pdppo:tenant:T:jobs", ACTIVE, "pdppo:running", "pdppo:outbox", "pdppo:purge"],
        ["J", "T", 5.5, "pdppo:job:"],
    ),
]
# fmt: on

VARIADIC = {"Create": 6, "Finish": 6}  # ARGV from this index on are a hash's field/value pairs


@pytest.mark.parametrize("row", CALLS, ids=lambda row: type(row.call).__name__)
def test_a_call_builds_keys_and_argv_in_its_scripts_order(row: Call) -> None:
    assert (row.call.keys(), row.call.args()) == (row.keys, row.args)


@pytest.mark.parametrize("row", CALLS, ids=lambda row: type(row.call).__name__)
def test_a_call_gives_as_many_keys_and_argv_as_its_script_reads(row: Call) -> None:
    """What the Lua reads, `KEYS[n]` and `ARGV[n]`, at its highest index (the fence's included):
    one key or argument more or fewer in a call than its script reads fails here."""
    read_keys = max(int(n) for n in re.findall(r"KEYS\[(\d+)\]", row.script))
    read_args = max(int(n) for n in re.findall(r"ARGV\[(\d+)\]", row.script))
    name = type(row.call).__name__
    if name in VARIADIC:  # the fixed part, then `for i = 6, #ARGV`
        read_args = VARIADIC[name] - 1
        assert f"for i = {VARIADIC[name]}, #ARGV" in row.script
        assert len(row.call.args()) > read_args
        assert len(row.call.keys()) == read_keys
        return
    assert (len(row.call.keys()), len(row.call.args())) == (read_keys, read_args)


def test_every_script_of_the_module_has_a_call() -> None:
    """A new transition script comes with its row above (the module's own scripts: not the Lua
    helpers it imports, nor `USERS`, a function other scripts include)."""
    tree = ast.parse(Path(t.__file__).read_text())
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    scripts = {
        name
        for name in assigned - {"USERS"}
        if isinstance(getattr(t, name), str) and "redis.call(" in getattr(t, name)
    }
    called = {name for name, value in vars(t).items() for row in CALLS if value is row.script}
    assert scripts == called
    assert len(called) == len(CALLS)


@pytest.mark.parametrize(
    ("result", "expected"), [(1, True), (0, False), (t.STALE, "fenced"), (-2, True)]
)
def test_checked_raises_fenced_out_for_stale_only(result: int, expected: object) -> None:
    try:
        got: object = t.checked("J", "step 3", result)
    except t.FencedOut as exc:
        assert str(exc) == "step 3 of job J refused: this claim no longer holds the job's lease"
        got = "fenced"
    assert got == expected


def test_the_fence_compares_the_named_key_with_the_named_argument() -> None:
    assert t.fenced("return 1\n", lease=4, token=6) == (
        "if ARGV[6] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[6] then return -1 end\nreturn 1\n"
    )
