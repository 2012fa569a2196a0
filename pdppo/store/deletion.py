"""Deleting what a tenant keeps: an ended job (`DELETE /v1/jobs/{id}`), an uploaded file
(`DELETE /v1/files/{id}`), and an old job's artifacts (retention, `workers.upkeep.retention`).

Each decision is one Lua script, so that what it checks still holds when it acts (a job's is
`pdppo.store.jobs.transitions.DeleteJob`, with every other change of a job's state):

- an ended job is deleted only when no worker holds its lease any more (a worker finishes a
  job, then gives up its lease: in between it may still write the job's last events), and no
  queued, running or paused job of the tenant starts from its final model (`job:<id>`);
- a file is deleted only when no queued, running or paused job of the tenant names it
  (`train.task.file`, `train.task.validation_file`); an ended job has its own link to it;
- retention marks a job's artifacts expired under the same rules, and only once it ended
  longer ago than the cutoff.

Who uses a file or a model is read from the specs of the tenant's active jobs (a set bounded by
PDPPO_MAX_ACTIVE_JOBS_PER_TENANT), decoded in the script; those job hashes are not declared in
KEYS, which a single Redis (what the service runs on) allows and Redis Cluster would not.

A deleted job's record, events, metrics, evaluations and samples go in the script; its folder is
removed by the caller right after. The script also puts the id in the purge set, which the
caller empties once the folder is gone: if it dies in between, a worker's retention pass removes
the folder (`workers.upkeep.retention`), so no crash leaves a folder that nothing will ever delete.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import cast

import redis
import redis.asyncio as aredis

from pdppo.store.jobs.transitions import JOB_KEY_PREFIX, USERS, DeleteJob
from pdppo.store.keys import (
    PURGE_SET,
    job_key,
    lease_key,
    tenant_active_key,
    tenant_file_bytes_key,
    tenant_file_key,
    tenant_files_key,
)

# KEYS: file hash, tenant's files, tenant's byte count, tenant active; ARGV: file id, job key
# prefix. Returns {'deleted', sha256}, {'used', ids...} or {'missing'}.
_DELETE_FILE = (
    USERS
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local used = users(KEYS[4], ARGV[2], ARGV[1], '')
if #used > 0 then table.insert(used, 1, 'used'); return used end
local sha = redis.call('HGET', KEYS[1], 'sha256')
redis.call('ZREM', KEYS[2], redis.call('HGET', KEYS[1], 'member'))
redis.call('DECRBY', KEYS[3], redis.call('HGET', KEYS[1], 'bytes'))
redis.call('DEL', KEYS[1])
return {'deleted', sha}
"""
)

# KEYS: job, lease, tenant active; ARGV: id, tenant, cutoff (ISO, as now_iso writes it), now
# (ISO), job key prefix, keep final ('1': a succeeded job keeps final/, so that a job starting
# from it still can; else its record forgets its final model, so that `job:<id>` is refused at
# submit rather than failing at start). Returns expire (marked now), expired (marked before),
# missing, active, recent, leased or used.
_EXPIRE = (
    USERS
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if (not st) or redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[2] then return 'missing' end
if not ended(st) then return 'active' end
if redis.call('HEXISTS', KEYS[1], 'artifacts_expired_at') == 1 then return 'expired' end
local at = redis.call('HGET', KEYS[1], 'finished_at') or redis.call('HGET', KEYS[1], 'updated_at')
if (not at) or at > ARGV[3] then return 'recent' end
if redis.call('EXISTS', KEYS[2]) == 1 then return 'leased' end
if not (ARGV[6] == '1' and st == 'succeeded') then
  if #users(KEYS[3], ARGV[5], '', 'job:' .. ARGV[1]) > 0 then return 'used' end
  redis.call('HDEL', KEYS[1], 'final_model')
end
redis.call('HSET', KEYS[1], 'artifacts_expired_at', ARGV[4])
return 'expire'
"""
)


@dataclass(frozen=True)
class Deletion:
    """What a delete did: `deleted`, `missing`, `active` (with the job's `status`), `leased`
    (its worker is still finishing) or `used` (by the active jobs `users`)."""

    outcome: str
    status: str = ""
    users: tuple[str, ...] = ()
    sha256: str = ""


def _deletion(reply: list[str]) -> Deletion:
    outcome, rest = reply[0], reply[1:]
    if outcome == "active":
        return Deletion(outcome, status=rest[0])
    if outcome == "used":
        return Deletion(outcome, users=tuple(rest))
    if outcome == "deleted" and rest:
        return Deletion(outcome, sha256=rest[0])
    return Deletion(outcome)


class AsyncDeletion:
    """The API's deletes, over its `redis.asyncio` client (decode_responses=True)."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self._delete_file = client.register_script(_DELETE_FILE)

    async def delete_job(self, job_id: str, tenant: str) -> Deletion:
        """Removes an ended job's record and everything Redis keeps of it, and enters it in the
        purge set; the caller removes its folder, then calls `purged`."""
        reply = await DeleteJob(job_id=job_id, tenant=tenant, now=time.time()).arun(self.redis)
        return _deletion(reply)

    async def purged(self, job_id: str) -> None:
        await self.redis.zrem(PURGE_SET, job_id)

    async def delete_file(self, tenant: str, file_id: str) -> Deletion:
        """Removes the file's record unless an active job names it; `sha256` says which bytes
        the caller removes after."""
        reply = await self._delete_file(
            keys=[
                tenant_file_key(tenant, file_id),
                tenant_files_key(tenant),
                tenant_file_bytes_key(tenant),
                tenant_active_key(tenant),
            ],
            args=[file_id, JOB_KEY_PREFIX],
        )
        return _deletion(cast(list[str], reply))


class Retention:
    """The workers' side: marking old jobs' artifacts expired, and the purge set."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._expire = client.register_script(_EXPIRE)

    def expire(self, job_id: str, tenant: str, *, cutoff: str, now: str, keep_final: bool) -> str:
        keys = [job_key(job_id), lease_key(job_id), tenant_active_key(tenant)]
        args = [job_id, tenant, cutoff, now, JOB_KEY_PREFIX, "1" if keep_final else "0"]
        return str(self._expire(keys=keys, args=args))

    def purge_due(self, older_than: float, now: float | None = None) -> list[str]:
        """Ids deleted at least `older_than` seconds ago whose folder nobody has reported gone."""
        cutoff = (time.time() if now is None else now) - older_than
        return cast(list[str], self.redis.zrangebyscore(PURGE_SET, "-inf", cutoff))

    def purged(self, job_id: str) -> None:
        self.redis.zrem(PURGE_SET, job_id)
