"""Experiments: a tenant's record of a grid of child jobs, and which job runs each (arm, seed).

The children are ordinary jobs (`pdppo.store.jobs.api_side`); this store only remembers which they
are. The record is written before any child, under the experiment's Idempotency-Key, and each child
is created under a key derived from (experiment, arm, seed) (`keys.child_idempotency`): a creation
that dies half way leaves a record whose retry finds the children made so far and makes only the
rest. Every key has the tenant in it, so two tenants' experiments never meet, whatever their ids,
names or Idempotency-Keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aredis

from pdppo.store.keys import (
    experiment_idempotency_key,
    now_iso,
    spec_digest,
    tenant_experiment_key,
    tenant_experiment_runs_key,
    tenant_experiments_key,
)

# KEYS: record, tenant's experiments, idempotency (or a dummy); ARGV: id, idem ttl (0: none), then
# the record's field/value pairs. Returns {'existing', id} or {'created', id}.
_BEGIN = """
if tonumber(ARGV[2]) > 0 then
  local existing = redis.call('GET', KEYS[3])
  if existing then return {'existing', existing} end
end
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[2], 0, ARGV[1])
if tonumber(ARGV[2]) > 0 then redis.call('SET', KEYS[3], ARGV[1], 'EX', ARGV[2]) end
return {'created', ARGV[1]}
"""


@dataclass(frozen=True)
class ExperimentRecord:
    id: str
    tenant: str
    name: str | None
    spec_json: str
    spec_digest: str
    created_at: str
    baseline: str
    arms: list[dict[str, Any]]  # [{name, overrides}], in grid order
    seeds: list[int]
    runs: dict[tuple[int, int], str]  # (arm index, seed) -> child job id

    @property
    def spec(self) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads(self.spec_json))

    def ordered_runs(self) -> list[tuple[int, int, str]]:
        """(arm index, seed, job id), seed-major: the order the children were queued in."""
        return sorted(
            ((arm, seed, job) for (arm, seed), job in self.runs.items()),
            key=lambda run: (run[1], run[0]),
        )


def _decode(raw: dict[str, str], runs: dict[str, str]) -> ExperimentRecord:
    decoded: dict[tuple[int, int], str] = {}
    for field, job_id in runs.items():
        arm, _, seed = field.partition("/")
        decoded[(int(arm), int(seed))] = job_id
    return ExperimentRecord(
        id=raw["id"],
        tenant=raw["tenant"],
        name=raw.get("name") or None,
        spec_json=raw["spec"],
        spec_digest=raw["spec_digest"],
        created_at=raw["created_at"],
        baseline=raw["baseline"],
        arms=json.loads(raw["arms"]),
        seeds=json.loads(raw["seeds"]),
        runs=decoded,
    )


class AsyncExperimentStore:
    """What the API does to experiments, over the job store's `redis.asyncio` client."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client
        self._begin = client.register_script(_BEGIN)

    async def find(self, tenant: str, idempotency: str) -> str | None:
        """The experiment an Idempotency-Key made, if it did (within its lifetime)."""
        found = await self.redis.get(experiment_idempotency_key(tenant, idempotency))
        return cast(str | None, found)

    async def begin(
        self,
        *,
        experiment_id: str,
        tenant: str,
        name: str | None,
        spec_json: str,
        baseline: str,
        arms: list[dict[str, Any]],
        seeds: list[int],
        idempotency: str | None,
        idempotency_ttl: int,
    ) -> tuple[str, bool]:
        """Write the record (no child yet) or find the one `idempotency` already made: (id,
        created)."""
        fields = {
            "id": experiment_id,
            "tenant": tenant,
            "name": name or "",
            "spec": spec_json,
            "spec_digest": spec_digest(spec_json),
            "created_at": now_iso(),
            "baseline": baseline,
            "arms": json.dumps(arms),
            "seeds": json.dumps(seeds),
        }
        flat = [item for pair in fields.items() for item in pair]
        idem = (
            experiment_idempotency_key(tenant, idempotency)
            if idempotency
            else experiment_idempotency_key(tenant, "-")
        )
        outcome, found = await self._begin(
            keys=[
                tenant_experiment_key(tenant, experiment_id),
                tenant_experiments_key(tenant),
                idem,
            ],
            args=[experiment_id, idempotency_ttl if idempotency else 0, *flat],
        )
        return str(found), outcome == "created"

    async def add_run(
        self, tenant: str, experiment_id: str, arm_index: int, seed: int, job_id: str
    ) -> None:
        await self.redis.hset(
            tenant_experiment_runs_key(tenant, experiment_id), f"{arm_index}/{seed}", job_id
        )

    async def get(self, tenant: str, experiment_id: str) -> ExperimentRecord | None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(tenant_experiment_key(tenant, experiment_id))
        pipe.hgetall(tenant_experiment_runs_key(tenant, experiment_id))
        raw, runs = await pipe.execute()
        return _decode(raw, runs) if raw else None

    async def list(
        self, tenant: str, *, limit: int, cursor: str | None
    ) -> tuple[list[ExperimentRecord], str | None]:
        """Newest first (ids are time-ordered, as jobs'); the cursor is the last id returned."""
        upper = f"({cursor}" if cursor else "+"
        found = await self.redis.zrevrangebylex(
            tenant_experiments_key(tenant), upper, "-", start=0, num=limit + 1
        )
        ids = cast(list[str], found)
        page = ids[:limit]
        records = [r for i in page if (r := await self.get(tenant, i)) is not None]
        return records, (page[-1] if len(ids) > limit else None)

    async def delete(self, tenant: str, experiment_id: str) -> None:
        """The record and its index entry; its children are deleted first, as jobs."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(
            tenant_experiment_key(tenant, experiment_id),
            tenant_experiment_runs_key(tenant, experiment_id),
        )
        pipe.zrem(tenant_experiments_key(tenant), experiment_id)
        await pipe.execute()
