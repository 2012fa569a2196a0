"""Specs that would crash, hang or mislead a shared worker are a 422 at submit, naming the field.

Each poison input goes to the real API (`POST /v1/jobs`). Numbers JSON cannot carry (NaN,
Infinity, 1e400) are sent as raw JSON text, which Python's json (and so FastAPI) parses into
float nan/inf. Files under the test service's data root (`service.data_dir`, its only
PDPPO_DATA_ROOTS entry, on this same host) stand for a data root the API shares with workers.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.specs import smoke_spec
from tests.support.stack import Service

POISON = "__poison__"


def parked_spec(**train: Any) -> dict[str, Any]:
    """The smoke spec on the gpu queue (no GPU worker in the tests): were a poison spec ever
    accepted by mistake, it would stay queued instead of reaching the shared CPU worker."""
    spec = smoke_spec()
    spec["name"] = "poison"
    spec["resources"] = {"device": "gpu"}
    for key, value in train.items():
        spec["train"][key] = (
            {**spec["train"].get(key, {}), **value} if isinstance(value, dict) else value
        )
    return spec


def raw(spec: dict[str, Any], literal: str) -> bytes:
    """`spec` as JSON text with the POISON placeholder replaced by `literal` (e.g. NaN)."""
    text = json.dumps(spec)
    assert f'"{POISON}"' in text
    return text.replace(f'"{POISON}"', literal).encode()


def post(client: httpx.Client, body: dict[str, Any] | bytes) -> httpx.Response:
    if isinstance(body, bytes):
        response = client.post(
            "/v1/jobs", content=body, headers={"Content-Type": "application/json"}
        )
    else:
        response = client.post("/v1/jobs", json=body)
    if response.status_code == 201:  # never expected: do not leave a job behind
        client.post(f"/v1/jobs/{response.json()['id']}/cancel")
    return response


def assert_422(response: httpx.Response, field: str, problem: str) -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["detail"].startswith(f"{field}: "), body["detail"]
    assert problem in body["detail"], body["detail"]


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        (
            raw(parked_spec(optim={"weight_decay": POISON}), "Infinity"),
            "train.optim.weight_decay",
            "must be finite (got Infinity)",
        ),
        (
            raw(parked_spec(algorithm={"delta_high": POISON}), "1e400"),
            "train.algorithm.delta_high",
            "must be finite (got Infinity)",
        ),
        (
            raw(parked_spec(optim={"lr": POISON}), "NaN"),
            "train.optim.lr",
            "must be finite (got NaN)",
        ),
        (
            raw(parked_spec(rollout={"temperature": POISON}), "1e-300"),
            "train.rollout.temperature",
            "greater than or equal to 0.01",
        ),
        (
            raw(parked_spec(seed=POISON), "99999999999999999999999"),
            "train.seed",
            "less than or equal to 9223372036854775804",
        ),
        (
            parked_spec(task={"name": "jsonl", "path": "/data/a\x00.jsonl"}),
            "train.task.path",
            "must not contain control characters (found U+0000",
        ),
        (parked_spec(steps="3"), "train.steps", "Input should be a valid integer"),
        (parked_spec(seed=True), "train.seed", "Input should be a valid integer"),
        (
            parked_spec(algorithm={"normalize_std": "true"}),
            "train.algorithm.normalize_std",
            "Input should be a valid boolean",
        ),
        (
            {**parked_spec(), "name": "line one\nline two"},
            "name",
            "must not contain control characters (found U+000A",
        ),
    ],
    ids=[
        "weight_decay-Infinity",
        "delta_high-1e400",
        "lr-NaN",
        "temperature-1e-300",
        "seed-24-digits",
        "task.path-NUL",
        "steps-string",
        "seed-bool",
        "normalize_std-string",
        "name-newline",
    ],
)
def test_poison_values_are_422_naming_the_field(
    alice: httpx.Client, body: dict[str, Any] | bytes, field: str, problem: str
) -> None:
    response = post(alice, body)
    assert_422(response, field, problem)
    assert response.json()["errors"][0]["loc"][:1] == ["body"]


def jsonl_spec(path: str) -> dict[str, Any]:
    return parked_spec(task={"name": "jsonl", "path": path})


def model_spec(name: str) -> dict[str, Any]:
    spec = parked_spec()
    spec["train"]["model"] = {"name": name}
    return spec


@pytest.fixture
def poison_files(service: Service) -> Iterator[Callable[[str], Path]]:
    """Makes paths under the service's data root; removes them afterwards."""
    made: list[Path] = []

    def place(name: str) -> Path:
        path = service.data_dir / name
        made.append(path)
        return path

    yield place
    for path in made:
        if path.is_symlink() or path.exists():
            path.unlink()


def test_a_fifo_under_the_data_root_is_422(
    alice: httpx.Client, poison_files: Callable[[str], Path]
) -> None:
    """It used to be accepted, and the worker's `open()` then blocked forever."""
    fifo = poison_files("fifo.jsonl")
    os.mkfifo(fifo)
    assert_422(
        post(alice, jsonl_spec(str(fifo))), "train.task.path", "is a FIFO, not a regular file"
    )


def test_a_symlink_to_dev_zero_under_the_data_root_is_422(
    alice: httpx.Client, poison_files: Callable[[str], Path]
) -> None:
    link = poison_files("zero.jsonl")
    link.symlink_to("/dev/zero")
    assert_422(
        post(alice, jsonl_spec(str(link))), "train.task.path", "leads outside the data roots"
    )


def test_symlinks_to_another_folder_outside_the_roots_are_422(
    alice: httpx.Client, service: Service, poison_files: Callable[[str], Path]
) -> None:
    """A link inside the root that leads to another tenant's artifacts passes a lexical check."""
    victim = service.artifact_dir / "other-tenant-job" / "final"
    victim.mkdir(parents=True, exist_ok=True)
    (victim / "data.jsonl").write_text('{"prompt": "secret", "answer": "s"}\n')
    folder = poison_files("tenant-b")
    folder.symlink_to(victim.parent, target_is_directory=True)
    assert_422(
        post(alice, jsonl_spec(f"{folder}/final/data.jsonl")),
        "train.task.path",
        "leads outside the data roots",
    )
    assert_422(
        post(alice, model_spec(f"hf:{folder}/final")),
        "train.model.name",
        "leads outside the data roots",
    )


def test_relative_paths_are_422_never_resolved_on_the_server(alice: httpx.Client) -> None:
    """`hf:tests/core` looks like a hub id but names a folder of the server's working directory
    (the repository, in the test service): refused rather than read."""
    assert_422(
        post(alice, jsonl_spec("mydata/add.jsonl")),
        "train.task.path",
        "must be an absolute path under",
    )
    assert_422(
        post(alice, model_spec("hf:./models/m")),
        "train.model.name",
        "must be an absolute path under",
    )
    assert_422(
        post(alice, model_spec("hf:tests/core")),
        "train.model.name",
        "names a file relative to the server's working directory",
    )


def test_a_regular_file_under_the_root_is_still_accepted(
    alice: httpx.Client, poison_files: Callable[[str], Path]
) -> None:
    data = poison_files("fine.jsonl")
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    alias = poison_files("alias.jsonl")
    alias.symlink_to(data)
    for path in (data, alias):
        response = alice.post("/v1/jobs", json=jsonl_spec(str(path)))
        assert response.status_code == 201, response.text
        alice.post(f"/v1/jobs/{response.json()['id']}/cancel")


@pytest.mark.parametrize("kind", ["fifo", "link-out"])
def test_the_worker_refuses_what_appears_after_submit(
    make_service: Callable[..., Service], kind: str
) -> None:
    """The API checks only what it can see when the job is submitted (it may not share the
    workers' disks). A FIFO or a symlink out of the roots that appears later is refused by the
    worker before it opens anything, and the job fails as invalid_input instead of hanging."""
    svc = make_service()
    svc.start_api()
    target = svc.data_dir / "later.jsonl"
    with svc.client("alice") as alice:
        created = alice.post(
            "/v1/jobs", json=jsonl_spec(str(target)) | {"resources": {"device": "cpu"}}
        )
        assert created.status_code == 201, created.text
        if kind == "fifo":
            os.mkfifo(target)
        else:
            outside = svc.root / "elsewhere.jsonl"
            outside.write_text('{"prompt": "secret", "answer": "s"}\n')
            target.symlink_to(outside)
        svc.start_worker()
        deadline = time.monotonic() + 60
        while (job := alice.get(f"/v1/jobs/{created.json()['id']}").json())["status"] != "failed":
            assert job["status"] in ("queued", "running") and time.monotonic() < deadline, job
            time.sleep(0.1)
    assert job["error"]["code"] == "invalid_input"
    reason = "is a FIFO, not a regular file" if kind == "fifo" else "leads outside the data roots"
    assert reason in job["error"]["message"]
