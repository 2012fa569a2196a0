"""`model.name: job:<id>` on the real stack: a job starts from the final model of the tenant's own
earlier job, nobody else's; and a run that learns nothing says so with a warning event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors.torch import load_file

from core.training.trainer import train
from pdppo.spec import JobSpec
from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import read_events, wait_status

TIMING = {"tokens_per_s", "rollout_time", "update_time", "step_time"}


def test_a_job_starts_from_an_earlier_jobs_final_model(
    service: Service, alice: httpx.Client, bob: httpx.Client, tmp_path: Path
) -> None:
    # a job that never finished has no final model
    cancelled = alice.post("/v1/jobs", json=smoke_spec(steps=500)).json()["id"]
    alice.post(f"/v1/jobs/{cancelled}/cancel")
    wait_status(alice, cancelled, "cancelled")
    early = alice.post("/v1/jobs", json=smoke_spec(model={"name": f"job:{cancelled}"}))
    assert early.status_code == 422, early.text
    assert early.json()["detail"].startswith(
        f"train.model.name: job '{cancelled}' has no final model (it is cancelled)"
    )

    first = alice.post("/v1/jobs", json=smoke_spec(steps=3, checkpoint_every=0))
    assert first.status_code == 201, first.text
    a = first.json()["id"]
    wait_status(alice, a, "succeeded")

    # the spec's tiny dims differ from A's: the saved model's shape wins
    spec_b = smoke_spec(
        steps=2,
        checkpoint_every=0,
        seed=7,
        model={"name": f"job:{a}", "tiny": {"d_model": 16, "n_layers": 2, "n_heads": 2}},
        algorithm={"mask": "predictive", "top_k": 8, "kl_beta": 0.1},
        # an lr so small that B's final model is its step-0 policy to 1e-8
        optim={"lr": 1e-9, "schedule": "linear", "grad_accumulation": 2},
    )
    checked = alice.post("/v1/jobs:validate", json=spec_b).json()
    assert checked["ok"], checked
    assert checked["estimate"]["model_source"].startswith(f"job:{a} (d_model=32, n_layers=1")
    second = alice.post("/v1/jobs", json=spec_b)
    assert second.status_code == 201, second.text
    b = second.json()["id"]
    assert wait_status(alice, b, {"succeeded", "failed"}, timeout=120)["status"] == "succeeded"
    published = alice.get(f"/v1/jobs/{b}/metrics").json()["items"]
    assert [row["step"] for row in published] == [1, 2]
    a_final = service.artifact_dir / a / "final"
    b_final = service.artifact_dir / b / "final"
    saved = json.loads((b_final / "config.json").read_text())
    assert saved["tiny"] == json.loads((a_final / "config.json").read_text())["tiny"]
    assert saved["tiny"]["d_model"] == 32
    a_weights = load_file(str(a_final / "model.safetensors"))
    b_weights = load_file(str(b_final / "model.safetensors"))
    assert set(a_weights) == set(b_weights)
    for name, weight in a_weights.items():
        torch.testing.assert_close(b_weights[name], weight, rtol=0, atol=1e-8)

    # and its metrics are a function of that start: the same spec trained here from A's folder
    # (one thread, like the worker) reproduces them; the KL to the reference starts at 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(JobSpec.model_validate(spec_b).train, tmp_path / "here", model_dir=a_final)
    finally:
        torch.set_num_threads(threads)
    here = [json.loads(line) for line in (tmp_path / "here" / "metrics.jsonl").open()]
    for ours, theirs in zip(here, published, strict=True):
        for key, value in theirs["metrics"].items():
            if key not in TIMING:
                assert abs(ours[key] - value) <= 1e-5 * max(1.0, abs(value)), key
    assert published[0]["metrics"]["kl_ref"] < 1e-6

    # nobody else's job, and no job that does not exist: one answer for both
    for client, name in ((bob, f"job:{a}"), (alice, "job:0123456789abcdef01234567")):
        refused = client.post("/v1/jobs", json=smoke_spec(model={"name": name}))
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"]
        assert detail.startswith(f"train.model.name: {name!r} names no job of yours"), detail
        problems = client.post("/v1/jobs:validate", json=smoke_spec(model={"name": name})).json()
        assert [p["field"] for p in problems["problems"]] == ["train.model.name"]
        assert problems["estimate"]["params"] is None  # nothing of a foreign model is read


def test_a_run_that_learns_nothing_publishes_a_warning(
    service: Service, alice: httpx.Client
) -> None:
    """Answers a 4-token completion can never match: every reward is 0, every advantage too."""
    data = service.data_dir / "never.jsonl"
    rows = [{"prompt": f"q{i}:", "answer": "ZZZZZZZZZZZZ"} for i in range(8)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task: dict[str, Any] = {"name": "jsonl", "path": str(data), "min_len": 2, "max_len": 3}
    spec = smoke_spec(steps=3, checkpoint_every=0, silent_steps=2, task=task)
    created = alice.post("/v1/jobs", json=spec)
    assert created.status_code == 201, created.text
    events = read_events(alice, created.json()["id"])
    warnings = [e["data"] for e in events if e["event"] == "log" and e["data"].get("level")]
    # once, early; then the verdict at the end (the record's `warnings`: test_phases)
    ends = [
        "run finished with a warning (no_reward_variance)",
        "run finished with a warning (rewards_all_zero)",
    ]
    assert [w["message"].split(":")[0] for w in warnings[1:]] == ends, warnings
    assert warnings[0]["level"] == "warning"
    assert warnings[0]["message"].startswith(
        "reward was 0 on every completion of the first 2 steps: the grader never matched"
    )
    metrics = [e["data"]["metrics"] for e in events if e["event"] == "metrics"]
    assert [m["zero_adv_groups"] for m in metrics] == [1.0, 1.0, 1.0]
    assert events[-1]["data"] == {"status": "succeeded"}
