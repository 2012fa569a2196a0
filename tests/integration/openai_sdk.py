"""The official `openai` SDK against the started stack: reinforcement jobs, their files, and
waiting on them (tests/integration/test_openai_*.py, test_python_grader_loading.py)."""

from __future__ import annotations

import json
import time
from typing import Any

from openai import OpenAI

from tests.support.stack import KEYS, Service

TINY = {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 48}


SMALL = {
    "resources": {"device": "cpu"},
    "train": {
        "model": {"tiny": TINY},
        "rollout": {"group_size": 4, "max_new_tokens": 4},
        "checkpoint_every": 2,
        "keep_checkpoints": 2,
        "device": "cpu",
    },
}


OUT = "{{sample.output_text}}"


MULTI: dict[str, Any] = {
    "type": "multi",
    "name": "answer",
    "graders": {
        "exact": {
            "type": "string_check",
            "name": "exact",
            "input": OUT,
            "reference": "{{item.answer}}",
            "operation": "eq",
        },
        "close": {
            "type": "text_similarity",
            "name": "close",
            "input": OUT,
            "reference": "{{item.answer}}",
            "evaluation_metric": "fuzzy_match",
        },
    },
    "calculate_output": "max(exact, 0.5 * close)",
}


def rft_rows(n: int, tag: str = "") -> bytes:
    """OpenAI's RFT format: `messages` and the fields the grader reads."""
    rows = []
    for i in range(n):
        digits = f"{(i * 37 + 11) % 1000:03d}"
        message = {"role": "user", "content": f"{tag}{digits}="}
        rows.append(json.dumps({"messages": [message], "answer": digits[::-1]}))
    return ("\n".join(rows) + "\n").encode()


def reinforcement(grader: dict[str, Any] | None = None, **hp: Any) -> dict[str, Any]:
    return {
        "type": "reinforcement",
        "reinforcement": {"grader": grader or MULTI, "hyperparameters": hp},
    }


def wait(client: OpenAI, job_id: str, statuses: set[str], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in statuses or time.monotonic() > deadline:
            return job
        time.sleep(0.2)


def upload(client: OpenAI, content: bytes, name: str = "train.jsonl") -> str:
    return client.files.create(file=(name, content), purpose="fine-tune").id


ONE_STEP = SMALL  # 4 records, 4 prompts a step, one epoch: one step


def sdk(service: Service) -> OpenAI:
    return OpenAI(base_url=f"{service.base_url}/v1", api_key=KEYS["alice"], max_retries=0)


def step_metrics(client: OpenAI, job_id: str) -> list[dict[str, Any]]:
    """The metrics of every training step, oldest first."""
    events = client.fine_tuning.jobs.list_events(job_id, limit=100)
    rows = [e.data for e in events if e.type == "metrics" and not e.data.get("eval")]
    return sorted(rows, key=lambda row: row["step"])


def create(client: OpenAI, grader: dict[str, Any], pdppo: dict[str, Any] | None = None) -> Any:
    return client.fine_tuning.jobs.create(
        model="builtin:tiny",
        training_file=upload(client, rft_rows(4)),
        method=reinforcement(grader, batch_size=4, n_epochs=1),
        extra_body={"pdppo": pdppo or ONE_STEP},
    )
