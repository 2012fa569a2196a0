"""What every request does to a job in every state: the store's state machine as ONE table.

Each row: a job seeded in `state` (`STATES`), one `request` (`tests/store/test_transitions.py`
names what each runs), and what must follow:

- `returns`: what the store method answers (`fenced`: it raised `FencedOut`);
- `after`: the job as `describe` reads it back: its status, `:code` for a failure,
  `+expired` once retention expired its artifacts, `+cancel` / `+pause` / `+stopping` for a
  flag set (`missing`: no record); `=` the same as seeded;
- `events`: the types of the entries the request added to the job's stream, in order;
- `changes`: the counters and stamps it changed (the hash fields `TRACKED`, and the
  `ended|queue|status|code` count of `pdppo.store.stats`), sorted;
- `indexes`: where the job is listed after: `listed` (its tenant's jobs), `active` (its
  tenant's active set), `running` (the running set), `outbox`, `fair` (its queue's fair order,
  `pdppo.store.jobs.fair`), `lease` (its lease key),
  `purge` (deleted, its folder to remove); `=` as seeded.

The jobs run on queue `gpu`, so that a count falling back to `cpu` shows. A row per state a
request can meet, including two flags at once where the protocol allows it: a cancel after a
pause request (`running+cancel+pause`); a pause after a cancel is refused (`cancelling`).
"""

# ruff: noqa: E501 (one row a line: the table reads as a table)

from __future__ import annotations

from typing import NamedTuple

JOB = "0000000000aa000000000001"
TENANT = "t"
QUEUE = "gpu"
TOKEN = "w1:0123456789abcdef"  # the lease token of the worker that claimed the job
TRACKED = (
    *("attempts", "config_version", "error_message", "finished_at", "requeues", "started_at"),
    "queued_at",  # when it entered the queue: the oldest-queued age reads it, a PATCH must not move it
    *("step", "total_steps", "worker_losses", "eval_step", "samples_step", "checkpoint_step"),
)

# state -> (status, extra hash fields, whether TOKEN holds the job's lease)
STATES: dict[str, tuple[str, dict[str, str], bool]] = {
    "queued": ("queued", {}, False),
    "running": ("running", {}, True),
    "running+cancel": ("running", {"cancel_requested": "1"}, True),
    "running+pause": ("running", {"pause_requested": "1"}, True),
    "running+cancel+pause": ("running", {"cancel_requested": "1", "pause_requested": "1"}, True),
    # its worker has begun carrying the pause out (`JobStore.begin_pause`)
    "running+pause+stopping": ("running", {"pause_requested": "1", "pause_stopping": "1"}, True),
    "running+lost": ("running", {"worker_losses": "1"}, True),  # lost a worker once already
    "paused": ("paused", {}, False),
    "succeeded": ("succeeded", {}, False),
    "succeeded+lease": ("succeeded", {}, True),  # its worker has not let go of it yet
    "failed:training_error": (
        "failed",
        {"error_code": "training_error", "error_message": "m"},
        False,
    ),
    "failed:storage_full": ("failed", {"error_code": "storage_full", "error_message": "m"}, False),
    "failed:storage_full+expired": (
        "failed",
        {"error_code": "storage_full", "artifacts_expired_at": "2026-01-01T00:00:00.000Z"},
        False,
    ),
    "cancelled": ("cancelled", {"cancel_requested": "1"}, False),
    "missing": ("", {}, False),
}


class Row(NamedTuple):
    state: str
    request: str
    returns: object
    after: str
    events: str
    changes: str
    indexes: str


def unchanged(request: str, returns: object, *states: str) -> list[Row]:
    """Rows where the request answers `returns` and leaves the job exactly as it was."""
    return [Row(state, request, returns, "=", "", "", "=") for state in states]


def ended(status: str, code: str = "") -> str:
    """The changes of a job's end: its count, its `finished_at`, a failure's message."""
    message = " error_message" if status == "failed" else ""
    return f"ended|{QUEUE}|{status}|{code}{message} finished_at"


ENDED = ("succeeded", "failed:training_error", "failed:storage_full", "cancelled")
RUNNING = ("running", "running+cancel", "running+pause", "running+cancel+pause")

# fmt: off
ROWS: list[Row] = [
    # create (API): a new job under its tenant's quota of 2 active jobs, or of none
    Row("missing", "create", "created", "queued", "status", "attempts queued_at total_steps", "listed active outbox fair"),
    *unchanged("create:full", "limit", "missing"),

    # claim: a worker takes the job (queued, or running whose lease the caller took over)
    Row("queued", "claim", True, "running", "status", "attempts started_at", "listed active running"),
    *[Row(s, "claim", True, "=", "", "attempts", "=") for s in RUNNING],
    Row("running+pause+stopping", "claim", True, "running+pause", "", "attempts", "="),  # a new run
    *unchanged("claim", False, "paused", *ENDED, "missing"),

    # publish: step 1's metrics, by the holder of the lease (TOKEN)
    *[Row(s, "publish", True, "=", "metrics", "step", "=") for s in RUNNING],
    Row("succeeded+lease", "publish", False, "=", "", "", "="),  # holds the lease, not running
    *unchanged("publish", "fenced", "queued", "paused", *ENDED, "missing"),  # no lease
    # ... step 1's evaluation, its samples, a phase: the same rule, each its own script's
    *[Row(s, "publish:eval", True, "=", "eval", "eval_step", "=") for s in RUNNING],
    Row("succeeded+lease", "publish:eval", False, "=", "", "", "="),
    *unchanged("publish:eval", "fenced", "queued", "paused", *ENDED, "missing"),
    *[Row(s, "publish:samples", True, "=", "samples", "samples_step", "=") for s in RUNNING],
    Row("succeeded+lease", "publish:samples", False, "=", "", "", "="),
    *unchanged("publish:samples", "fenced", "queued", "paused", *ENDED, "missing"),
    *[Row(s, "publish:phase", True, "=", "phase", "", "=") for s in RUNNING],
    Row("succeeded+lease", "publish:phase", False, "=", "", "", "="),
    *unchanged("publish:phase", "fenced", "queued", "paused", *ENDED, "missing"),
    # ... a checkpoint (its event goes to the webhook feed as well)
    *[Row(s, "publish:checkpoint", True, "=", "checkpoint", "checkpoint_step", "=") for s in RUNNING],
    Row("succeeded+lease", "publish:checkpoint", False, "=", "", "", "="),
    *unchanged("publish:checkpoint", "fenced", "queued", "paused", *ENDED, "missing"),

    # finish: the job ends (a worker's outcome, or the API failing it)
    Row("queued", "finish:succeeded", True, "succeeded", "status done", ended("succeeded"), "listed"),
    Row("running", "finish:succeeded", True, "succeeded", "status done", ended("succeeded"), "listed lease"),
    Row("running+cancel", "finish:succeeded", True, "succeeded+cancel", "status done", ended("succeeded"), "listed lease"),
    Row("running+pause", "finish:succeeded", True, "succeeded+pause", "status done", ended("succeeded"), "listed lease"),
    Row("running+cancel+pause", "finish:succeeded", True, "succeeded+cancel+pause", "status done", ended("succeeded"), "listed lease"),
    Row("running+pause+stopping", "finish:succeeded", True, "succeeded+pause", "status done", ended("succeeded"), "listed lease"),
    Row("paused", "finish:succeeded", True, "succeeded", "status done", ended("succeeded"), "listed"),
    *unchanged("finish:succeeded", False, *ENDED, "missing"),
    Row("queued", "finish:failed", True, "failed:training_error", "status done", ended("failed", "training_error"), "listed"),
    Row("running", "finish:failed", True, "failed:training_error", "status done", ended("failed", "training_error"), "listed lease"),
    Row("running+cancel", "finish:failed", True, "failed:training_error+cancel", "status done", ended("failed", "training_error"), "listed lease"),
    Row("paused", "finish:failed", True, "failed:training_error", "status done", ended("failed", "training_error"), "listed"),
    *unchanged("finish:failed", False, *ENDED, "missing"),
    Row("running", "finish:cancelled", True, "cancelled", "status done", ended("cancelled"), "listed lease"),
    Row("running+cancel", "finish:cancelled", True, "cancelled+cancel", "status done", ended("cancelled"), "listed lease"),
    *unchanged("finish:cancelled", False, *ENDED, "missing"),

    # requeue: a reaper finds the lease expired (its worker died); no limit on worker losses
    Row("running", "requeue", "requeued", "queued", "log status", "queued_at requeues worker_losses", "listed active outbox fair"),
    Row("running+lost", "requeue", "requeued", "queued", "log status", "queued_at requeues worker_losses", "listed active outbox fair"),
    Row("running+cancel", "requeue", "cancelled", "cancelled+cancel", "status done", ended("cancelled"), "listed"),
    Row("running+pause", "requeue", "paused", "paused", "log status", "", "listed active"),
    Row("running+pause+stopping", "requeue", "paused", "paused", "log status", "", "listed active"),
    Row("running+cancel+pause", "requeue", "cancelled", "cancelled+cancel+pause", "status done", ended("cancelled"), "listed"),
    *unchanged("requeue", "not-running", "queued", "paused", *ENDED, "missing"),
    # ... with at most 1 worker loss: the second one fails the job
    Row("running", "requeue:limit1", "requeued", "queued", "log status", "queued_at requeues worker_losses", "listed active outbox fair"),
    Row("running+lost", "requeue:limit1", "failed", "failed:worker_lost", "status done", f"{ended('failed', 'worker_lost')} worker_losses", "listed"),
    Row("running+cancel", "requeue:limit1", "cancelled", "cancelled+cancel", "status done", ended("cancelled"), "listed"),
    Row("running+pause", "requeue:limit1", "paused", "paused", "log status", "", "listed active"),
    # ... while the lease is held: its worker is alive
    *unchanged("requeue:leased", "leased", *RUNNING, "succeeded+lease"),
    *unchanged("requeue:leased", "not-running", "queued", "paused", "succeeded"),
    # hand-back: the lease holder gives the job back (limit 1: a hand-back is no worker loss)
    Row("running", "hand-back", "requeued", "queued", "log status", "queued_at requeues", "listed active outbox fair"),
    Row("running+lost", "hand-back", "requeued", "queued", "log status", "queued_at requeues", "listed active outbox fair"),
    Row("running+cancel", "hand-back", "cancelled", "cancelled+cancel", "status done", ended("cancelled"), "listed"),
    Row("running+pause", "hand-back", "paused", "paused", "log status", "", "listed active"),
    Row("running+pause+stopping", "hand-back", "paused", "paused", "log status", "", "listed active"),
    Row("succeeded+lease", "hand-back", "not-running", "=", "", "", "listed"),  # lease let go
    *unchanged("hand-back", "not-running", "queued", "paused"),

    # begin-pause: the worker carries a pending pause out (by the holder of the lease, TOKEN)
    Row("running+pause", "begin-pause", True, "running+pause+stopping", "", "", "="),
    Row("running+pause+stopping", "begin-pause", True, "=", "", "", "="),
    *unchanged("begin-pause", False, "running", "running+cancel", "running+cancel+pause"),  # a cancel wins
    *unchanged("begin-pause", False, "succeeded+lease"),
    *unchanged("begin-pause", "fenced", "queued", "paused", *ENDED, "missing"),  # no lease

    # cancel (API)
    Row("queued", "cancel", "cancelled-while-queued", "cancelled+cancel", "status done", ended("cancelled"), "listed"),
    Row("running", "cancel", "requested", "running+cancel", "log", "", "="),
    Row("running+cancel", "cancel", "requested", "=", "", "", "="),  # asked once, logged once
    Row("running+pause", "cancel", "requested", "running+cancel+pause", "log", "", "="),
    Row("running+cancel+pause", "cancel", "requested", "=", "", "", "="),
    Row("running+pause+stopping", "cancel", "requested", "running+cancel+pause+stopping", "log", "", "="),
    Row("paused", "cancel", "cancelled-while-paused", "cancelled+cancel", "status done", ended("cancelled"), "listed"),
    *unchanged("cancel", "already-succeeded", "succeeded"),
    *unchanged("cancel", "already-failed", "failed:training_error", "failed:storage_full"),
    *unchanged("cancel", "already-cancelled", "cancelled"),
    *unchanged("cancel", "missing", "missing"),

    # pause (API)
    Row("queued", "pause", "paused", "paused", "status", "", "listed active"),
    Row("running", "pause", "requested", "running+pause", "log", "", "="),
    Row("running+pause", "pause", "requested", "=", "", "", "="),
    Row("running+pause+stopping", "pause", "requested", "=", "", "", "="),
    *unchanged("pause", "cancelling", "running+cancel", "running+cancel+pause"),
    *unchanged("pause", "already-paused", "paused"),
    *unchanged("pause", "already-succeeded", "succeeded"),
    *unchanged("pause", "already-failed", "failed:training_error", "failed:storage_full"),
    *unchanged("pause", "already-cancelled", "cancelled"),
    *unchanged("pause", "missing", "missing"),

    # resume (API; the tenant may have 2 active jobs)
    Row("paused", "resume", "queued", "queued", "status", "queued_at", "listed active outbox fair"),
    Row("running+pause", "resume", "withdrawn", "running", "log", "", "="),
    Row("running+pause+stopping", "resume", "withdrawn", "running+stopping", "log", "", "="),  # it stops anyway
    Row("running+cancel+pause", "resume", "withdrawn", "running+cancel", "log", "", "="),
    Row("failed:storage_full", "resume", "queued", "queued", "log status", "error_message finished_at queued_at", "listed active outbox fair"),
    *unchanged("resume", "expired", "failed:storage_full+expired"),
    *unchanged("resume", "already-queued", "queued"),
    *unchanged("resume", "already-running", "running", "running+cancel"),
    *unchanged("resume", "already-succeeded", "succeeded"),
    *unchanged("resume", "already-failed", "failed:training_error"),
    *unchanged("resume", "already-cancelled", "cancelled"),
    *unchanged("resume", "missing", "missing"),
    # ... when the tenant may have no active job: a paused one holds its place already
    Row("paused", "resume:full", "queued", "queued", "status", "queued_at", "listed active outbox fair"),
    *unchanged("resume:full", "limit", "failed:storage_full"),

    # patch (API): settings changed from version 0, total steps to 20
    *[Row(s, "patch", ("patched", "1"), "=", "log", "config_version total_steps", "=")
      for s in ("queued", "running", "running+cancel+pause", "paused")],
    *unchanged("patch", ("terminal", "succeeded"), "succeeded"),
    *unchanged("patch", ("terminal", "failed"), "failed:training_error"),
    *unchanged("patch", ("terminal", "cancelled"), "cancelled"),
    *unchanged("patch", ("missing", ""), "missing"),
    *unchanged("patch:stale", ("conflict", "0"), "queued", "running"),  # from version 3
    # ... with If-Match: the version the change was computed from (0) is the job's, or is not (3,
    # a client that read the job before another change); a list matches any of its versions
    *[Row(s, "patch:if-match", ("patched", "1"), "=", "log", "config_version total_steps", "=")
      for s in ("queued", "running", "running+cancel+pause", "paused")],
    *unchanged("patch:if-match", ("terminal", "succeeded"), "succeeded"),
    *unchanged("patch:if-match", ("missing", ""), "missing"),
    *unchanged("patch:if-match-stale", ("precondition", "0"), "queued", "running", "running+cancel+pause", "paused"),
    *unchanged("patch:if-match-stale", ("terminal", "succeeded"), "succeeded"),
    *unchanged("patch:if-match-stale", ("terminal", "cancelled"), "cancelled"),
    *unchanged("patch:if-match-stale", ("missing", ""), "missing"),
    Row("queued", "patch:if-match-list", ("patched", "1"), "=", "log", "config_version total_steps", "="),
    # ... If-Match naming the job's version, the change computed from another: computed again
    *unchanged("patch:if-match-moved", ("conflict", "0"), "queued", "running"),

    # delete (API): an ended job, by its tenant, once its worker let go of it
    *[Row(s, "delete", "deleted", "missing", "", "", "purge") for s in ENDED],
    *unchanged("delete", "active:queued", "queued"),
    *unchanged("delete", "active:running", "running"),
    *unchanged("delete", "active:paused", "paused"),
    *unchanged("delete", "leased", "succeeded+lease"),
    *unchanged("delete", "missing", "missing"),
    *unchanged("delete:other-tenant", "missing", "succeeded", "cancelled"),
]
# fmt: on
