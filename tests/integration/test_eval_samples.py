"""Held-out evaluation and rollout samples on the real stack: a JSONL job with a held-out split
streams `eval` and `samples` events in the trainer's order, the API serves them again
(`/eval` as JSON or CSV, `/samples` newest last), only to their tenant, and `pdppo logs` prints
them. The worker's publishing is checked on its own Redis too: once per step, and a resumed
job publishes the evaluations and samples that a killed run never got to Redis."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any, cast

import httpx
import redis

from pdppo.store import JobStore, StoreRetry, events_key, job_key
from pdppo.store.keys import eval_key, samples_key
from tests.support.seed import running_job
from tests.support.specs import smoke_spec
from tests.support.stack import KEYS, Service, pdppo_command
from tests.support.waits import read_events, wait_status
from workers.job.process import EventPublisher, backfill

STEPS = 4
EVAL_EVERY = 3  # evaluated after steps 3 and 4 (the last)
HELD_OUT = 10  # validation_fraction 0.25 of 40 records


def reverse_dataset(path: Path) -> None:
    digits = [f"{i:02d}{(7 * i) % 10}" for i in range(40)]
    path.write_text("".join(json.dumps({"prompt": f"reverse {d}=", "answer": d[::-1]}) + "\n"
                            for d in digits))  # fmt: skip


def eval_spec(service: Service) -> dict[str, Any]:
    data = service.data_dir / "reverse-eval.jsonl"
    reverse_dataset(data)
    spec = smoke_spec(
        steps=STEPS,
        eval_every=EVAL_EVERY,
        eval_samples=2,
        log_samples_every=1,
        log_samples_count=3,
    )
    spec["name"] = "eval-samples"
    spec["train"]["task"] = {"name": "jsonl", "path": str(data), "validation_fraction": 0.25}
    return spec


def test_eval_and_samples_stream_in_order_and_are_served_to_their_tenant_only(
    service: Service, alice: httpx.Client, bob: httpx.Client
) -> None:
    created = alice.post("/v1/jobs", json=eval_spec(service))
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    events = read_events(alice, job_id)
    assert events[-1] == {"id": events[-1]["id"], "event": "done",
                          "data": {"status": "succeeded"}}  # fmt: skip

    # the trainer's order: a step's metrics, its samples, its evaluation, then its checkpoint
    order = [(e["event"], e["data"].get("step")) for e in events
             if e["event"] in ("metrics", "samples", "eval", "checkpoint")]  # fmt: skip
    expected: list[tuple[str, int]] = []
    for step in range(1, STEPS + 1):
        expected += [("metrics", step), ("samples", step)]
        if step % EVAL_EVERY == 0 or step == STEPS:
            expected.append(("eval", step))
        if step % 2 == 0 or step == STEPS:  # smoke.yaml checkpoints every 2 steps
            expected.append(("checkpoint", step))
    assert order == expected

    evals = [e["data"] for e in events if e["event"] == "eval"]
    for data in evals:
        assert data["total"] == STEPS
        metrics = data["metrics"]
        assert metrics["eval_prompts"] == HELD_OUT
        assert {"eval_reward_mean", "eval_pass@1", "eval_pass@2", "eval_greedy_reward_mean",
                "eval_response_len", "eval_time"} <= set(metrics)  # fmt: skip
        assert 0 <= metrics["eval_pass@1"] <= metrics["eval_pass@2"] <= 1
        assert 0 <= metrics["eval_reward_mean"] <= 1
    samples = [e["data"] for e in events if e["event"] == "samples"]
    for data in samples:
        assert len(data["samples"]) == 3
        for sample in data["samples"]:
            assert sample["prompt"].startswith("reverse ") and sample["prompt"].endswith("=")
            assert sample["answer"] == sample["prompt"][8:-1][::-1]
            assert isinstance(sample["completion"], str) and sample["truncated"] is False
            assert 0 <= sample["reward"] <= 1

    # served again, as streamed
    got = alice.get(f"/v1/jobs/{job_id}/eval")
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["job_id"] == job_id
    assert body["items"] == [{"step": d["step"], "metrics": d["metrics"]} for d in evals]
    as_csv = alice.get(f"/v1/jobs/{job_id}/eval", params={"format": "csv"})
    by_accept = alice.get(f"/v1/jobs/{job_id}/eval", headers={"Accept": "text/csv"})
    for response in (as_csv, by_accept):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/csv")
        table = list(csv.DictReader(io.StringIO(response.text)))
        assert [int(r["step"]) for r in table] == [3, 4]
        assert float(table[-1]["eval_reward_mean"]) == evals[-1]["metrics"]["eval_reward_mean"]
    listed = alice.get(f"/v1/jobs/{job_id}/samples").json()
    assert listed["items"] == samples  # every row, oldest first (newest last)
    newest = alice.get(f"/v1/jobs/{job_id}/samples", params={"limit": 2}).json()
    assert [row["step"] for row in newest["items"]] == [3, 4]
    assert alice.get(f"/v1/jobs/{job_id}/samples", params={"limit": 0}).status_code == 422

    # another tenant cannot tell the job exists
    for path in ("eval", "samples"):
        denied = bob.get(f"/v1/jobs/{job_id}/{path}")
        assert denied.status_code == 404
        assert denied.json() == {"detail": f"job {job_id!r} not found"}

    # the CLI shows both while following
    env = {**os.environ, "PDPPO_URL": service.base_url, "PDPPO_API_KEY": KEYS["alice"]}
    cli = subprocess.run(
        [*pdppo_command(), "logs", job_id], env=env, capture_output=True, text=True, timeout=60
    )
    assert cli.returncode == 0, cli.stderr
    assert f"eval step {STEPS}: reward " in cli.stdout and "pass@2 " in cli.stdout
    assert "samples step 1:" in cli.stdout and "  [" in cli.stdout


def test_a_job_without_evaluation_serves_empty_results(
    service: Service, alice: httpx.Client
) -> None:
    created = alice.post("/v1/jobs", json=smoke_spec(steps=2))
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    wait_status(alice, job_id, "succeeded")
    assert alice.get(f"/v1/jobs/{job_id}/eval").json() == {"job_id": job_id, "items": []}
    assert alice.get(f"/v1/jobs/{job_id}/samples").json() == {"job_id": job_id, "items": []}
    assert alice.get(f"/v1/jobs/{job_id}/eval?format=csv").text == "step\n"


# -- the worker's publishing, on a Redis of its own ---------------------------------------------


def stream(client: redis.Redis, job_id: str) -> list[tuple[str, Any]]:
    entries = cast(list[tuple[str, dict[str, str]]], client.xrange(events_key(job_id)))
    return [(f["type"], json.loads(f["data"]).get("step")) for _, f in entries]


def sample(step: int) -> dict[str, Any]:
    return {"prompt": f"p{step}", "answer": "", "completion": "c", "reward": 0.5,
            "truncated": False}  # fmt: skip


def test_publishing_is_once_per_step_and_a_resume_backfills_what_redis_missed(
    client: redis.Redis, tmp_path: Path
) -> None:
    """The last run trained to step 6 and checkpointed step 4, but Redis got only up to step 2's
    metrics (its samples and evaluation were still queued when the run was killed): the resumed
    run publishes step 2's samples and evaluation, then steps 3-4 with theirs, once each."""
    store = JobStore(client)
    job = running_job(client, "evaljob", total_steps=12)
    assert store.publish_eval(job.id, 1, 12, {"eval_reward_mean": 0.25})
    assert not store.publish_eval(job.id, 1, 12, {"eval_reward_mean": 0.99})  # a retry
    assert store.publish_samples(job.id, 1, [sample(1)])
    assert not store.publish_samples(job.id, 1, [sample(1)])
    store.publish_step(job.id, 1, 12, {"loss": 1.0})  # (the trainer's order is not checked)
    store.publish_step(job.id, 2, 12, {"loss": 2.0})
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": float(s)}) + "\n" for s in range(1, 7))
    )
    (tmp_path / "samples.jsonl").write_text(
        "".join(json.dumps({"step": s, "samples": [sample(s)]}) + "\n" for s in range(1, 7))
    )
    (tmp_path / "eval.jsonl").write_text(
        "".join(json.dumps({"step": s, "eval_reward_mean": s / 10}) + "\n" for s in (1, 2, 4, 6))
        + '{"step": 7, "eval_rew'  # torn by the kill
    )
    ckpt = tmp_path / "checkpoints" / "step-000004"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": 4}))
    resumed = store.get(job.id)
    assert resumed is not None and resumed.step == 2

    publisher = EventPublisher(store, resumed, StoreRetry(30))
    publisher.start()
    assert backfill(publisher, tmp_path, resumed) == 2  # metrics of steps 3 and 4
    assert publisher.close()

    assert stream(client, job.id)[1:] == [  # after the claim's status
        ("eval", 1), ("samples", 1), ("metrics", 1), ("metrics", 2),
        ("samples", 2), ("eval", 2),
        ("metrics", 3), ("samples", 3),
        ("metrics", 4), ("samples", 4), ("eval", 4), ("checkpoint", 4),
    ]  # fmt: skip
    evals = [json.loads(r) for r in client.lrange(eval_key(job.id), 0, -1)]
    assert evals == [
        {"step": 1, "metrics": {"eval_reward_mean": 0.25}},
        {"step": 2, "metrics": {"eval_reward_mean": 0.2}},
        {"step": 4, "metrics": {"eval_reward_mean": 0.4}},
    ]
    rows = [json.loads(r) for r in client.lrange(samples_key(job.id), 0, -1)]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[2] == {"step": 3, "samples": [sample(3)]}
    assert client.hget(job_key(job.id), "eval_step") == "4"
