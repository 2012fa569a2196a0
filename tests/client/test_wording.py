"""What the service and the CLI say, checked word for word on the real stack: a mistyped setting
is an unknown field, an uploaded dataset is not a path, a cancel says what it did, and no 422
carries pydantic's "Value error, " prefix."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from click.testing import CliRunner

from pdppo.cli import main
from pdppo.client import Client
from tests.support.specs import parked_spec, records, smoke_spec
from tests.support.stack import KEYS, Service

TENANT = "carol"


def _run(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args, env=env)
    return result.exit_code, result.stdout, result.stderr


def test_set_with_a_mistyped_field_names_it_unknown(
    tmp_path: Path, cli_env: dict[str, str], client: Client
) -> None:
    job_id = client.submit(parked_spec("typo")).id
    try:
        code, out, err = _run(["set", job_id, "optim.lrr=1e-4"], cli_env)
        assert code == 2, (out, err)
        assert "unknown field optim.lrr; did you mean optim.lr?" in err, err
        assert "cannot change while a job runs" not in err
        # a real setting that may not change is still told so
        code, _, err = _run(["set", job_id, "rollout.group_size=8"], cli_env)
        assert code == 2 and "cannot change while a job runs" in err, err
    finally:
        client.cancel(job_id)


def test_validate_of_an_uploaded_dataset_speaks_of_the_file(tmp_path: Path, client: Client) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_bytes(records(6, "w"))
    file_id = client.upload_file(data).id
    spec = smoke_spec(steps=3, checkpoint_every=0)
    spec["train"]["task"] = {"name": "jsonl", "file": file_id}
    notes = client.validate(spec).estimate["notes"]
    assert not any("task.path" in note for note in notes), notes
    assert notes == [
        f"task.file {file_id}: the uploaded file's prompts are not measured: prompts are "
        "assumed as long as the model's sequence allows (28 tokens)"
    ]


def test_cancel_of_a_running_job_says_it_was_asked_not_running(
    cli_env: dict[str, str], client: Client
) -> None:
    job = client.submit(smoke_spec(steps=5000, checkpoint_every=0) | {"name": "cancel-words"})
    deadline = time.monotonic() + 60
    while client.get(job.id).progress.step < 1:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)
    code, out, err = _run(["cancel", job.id], cli_env)
    assert code == 0, (out, err)
    assert out.strip() == (
        f"{job.id} cancel requested: the running job stops within seconds, keeping its "
        f"checkpoints (pdppo status {job.id} says cancelled once it has)"
    )
    assert list(client.follow(job.id))[-1].json() == {"status": "cancelled"}
    parked = client.submit(parked_spec("cancel-queued"))
    code, out, _ = _run(["cancel", parked.id], cli_env)
    assert (code, out.strip()) == (0, f"{parked.id} cancelled")


def test_a_422_does_not_say_value_error(service: Service) -> None:
    spec = smoke_spec(eval_every=2)  # a held-out set is needed: the model validator refuses
    with httpx.Client(
        base_url=service.base_url, headers={"Authorization": f"Bearer {KEYS[TENANT]}"}
    ) as http:
        for path in ("/v1/jobs", "/v1/jobs:validate"):
            answer = http.post(path, json=spec)
            assert answer.status_code == 422, answer.text
            body = answer.json()
            assert "Value error" not in answer.text, body
            assert body["detail"].startswith("train: eval_every=2 needs held-out data"), body
            assert body["errors"][0]["msg"].startswith("eval_every=2 needs held-out data"), body
