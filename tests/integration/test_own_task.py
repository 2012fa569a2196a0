"""A user's own task end to end on the real stack: a dataset and a validation file uploaded over
HTTP, a job on them scored by a `multi` grader, with evaluation and samples; the job succeeds,
its events carry every part, and another tenant sees none of the files."""

from __future__ import annotations

import json

import httpx

from tests.support.specs import smoke_spec
from tests.support.waits import read_events, wait_status


def _records(n: int, offset: int) -> bytes:
    rows = []
    for i in range(offset, offset + n):
        digits = f"{i:03d}"
        if i % 2:  # chat and text records mix in one file
            rows.append(
                {"messages": [{"role": "user", "content": f"copy {digits}"}], "answer": digits}
            )
        else:
            rows.append({"prompt": f"copy {digits}=", "answer": digits})
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_uploaded_dataset_with_a_multi_grader_evaluation_and_samples(
    alice: httpx.Client, bob: httpx.Client
) -> None:
    train_file = alice.post("/v1/files", files={"file": ("copy.jsonl", _records(40, 0))})
    val_file = alice.post(
        "/v1/files",
        files={"file": ("copy-val.jsonl", _records(8, 500))},
        data={"purpose": "validation"},
    )
    assert train_file.status_code == 201 and val_file.status_code == 201, val_file.text
    train_id, val_id = train_file.json()["id"], val_file.json()["id"]
    assert (train_file.json()["records"], val_file.json()["records"]) == (40, 8)

    spec = smoke_spec(
        steps=3, eval_every=2, eval_samples=2, log_samples_every=1, log_samples_count=2
    )
    spec["train"]["task"] = {
        "name": "jsonl",
        "file": train_id,
        "validation_file": val_id,
        "grader": {
            "type": "multi",
            "graders": {
                "exact": {"type": "string_check"},
                "digits": {"type": "regex", "pattern": "[0-9]{3}"},
                "short": {"type": "length_penalty", "max_chars": 3},
            },
            "weights": {"exact": 2, "digits": 1, "short": 1},
        },
    }
    created = alice.post("/v1/jobs", json=spec)
    assert created.status_code == 201, created.text
    job = wait_status(
        alice, created.json()["id"], {"succeeded", "failed", "cancelled"}, timeout=180
    )
    assert job["status"] == "succeeded", job

    events = read_events(alice, job["id"])
    kinds = [e["event"] for e in events]
    metrics = [e["data"] for e in events if e["event"] == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        parts = {k: v for k, v in m["metrics"].items() if k.startswith("grader/")}
        assert set(parts) == {"grader/exact", "grader/digits", "grader/short"}
        # the reward is the weighted mean of the parts (each part averaged over the batch)
        weighted = (2 * parts["grader/exact"] + parts["grader/digits"] + parts["grader/short"]) / 4
        assert abs(m["metrics"]["reward_mean"] - weighted) < 1e-5
        assert m["metrics"]["grader_timeouts"] == 0.0 and m["metrics"]["grader_errors"] == 0.0
    evals = [e["data"] for e in events if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [2, 3]  # every 2 steps, and after the last one
    assert all(e["metrics"]["eval_prompts"] == 8 for e in evals)
    assert all("eval_pass@2" in e["metrics"] for e in evals)
    samples = [e["data"] for e in events if e["event"] == "samples"]
    assert [s["step"] for s in samples] == [1, 2, 3]
    assert all(len(s["samples"]) == 2 for s in samples)
    assert kinds[-1] == "done"

    for path in (f"/v1/files/{train_id}", f"/v1/files/{val_id}/content"):
        assert bob.get(path).status_code == 404
    assert train_id not in [f["id"] for f in bob.get("/v1/files").json()["items"]]
    bob_spec = json.loads(json.dumps(spec))
    refused = bob.post("/v1/jobs", json=bob_spec)
    assert refused.status_code == 422 and "train.task.file" in refused.json()["detail"]
    for file_id in (train_id, val_id):
        assert alice.delete(f"/v1/files/{file_id}").status_code == 200
