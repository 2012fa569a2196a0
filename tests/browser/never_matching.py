"""A job whose grader never matches: a small uploaded dataset whose answers are longer than the
tiny model may generate (`max_new_tokens: 4`), so every reward of every step is 0."""

from __future__ import annotations

import json

import httpx

from tests.support.specs import smoke_spec

ANSWER = "never-the-answer"


def submit_never_matching(client: httpx.Client, steps: int) -> str:
    """Uploads the dataset, submits the job and returns its id."""
    rows = [json.dumps({"prompt": f"{i:02d}=", "answer": ANSWER}) for i in range(16)]
    uploaded = client.post("/v1/files", files={"file": ("never.jsonl", "\n".join(rows) + "\n")})
    assert uploaded.status_code in (200, 201), uploaded.text
    spec = smoke_spec(steps=steps, checkpoint_every=0)
    spec["name"] = "never-matching"
    spec["train"]["task"] = {"name": "jsonl", "file": uploaded.json()["id"]}
    created = client.post("/v1/jobs", json=spec)
    assert created.status_code == 201, created.text
    job_id: str = created.json()["id"]
    return job_id
