"""A full disk under the real service: its artifact folder on a 1 MiB tmpfs
(`tests.support.small_disk`), the API and a worker on it, as an operator would meet it.

Uploads that do not fit answer 507 and leave no `.upload-*.part`; `/readyz` stays ready and says
`disk: low`; the gauges show the disk; a job that cannot fit its first checkpoint is refused at
start (`storage_full`, naming the folder, free and needed bytes); one that fills the disk mid-run
fails `storage_full`, keeps its checkpoint and no temporary folder, and once space is back
`POST /resume` takes it to `succeeded`.

The tests of this module run in order on one service (each leaves the disk as it found it, but
the last, which grows it).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.support.small_disk import fill, names, small_disk
from tests.support.specs import smoke_spec
from tests.support.stack import REDIS_DATABASES, RedisServer, Service, job_pids
from tests.support.waits import read_events, wait_for, wait_status

MIB = 1 << 20
RESERVE = 64 * 1024  # PDPPO_MIN_FREE_BYTES of the service
TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module")
def disk_service(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """Like `make_service`'s (a database of its own), with its artifact folder on a tmpfs that
    is unmounted only after the service stopped."""
    base = tmp_path_factory.getbasetemp()
    db = next(itertools.count(1 + len(list(base.glob("extra*")))))
    assert db < REDIS_DATABASES
    svc = Service(
        redis_server,
        tmp_path_factory.mktemp("extra"),
        db=db,
        env={"PDPPO_MIN_FREE_BYTES": str(RESERVE)},
    )
    with small_disk(svc.artifact_dir, MIB):
        try:
            svc.start_api()
            svc.start_worker("cpu")
            yield svc
        finally:
            svc.stop()


@pytest.fixture
def alice(disk_service: Service) -> Iterator[httpx.Client]:
    with disk_service.client("alice") as client:
        yield client


def leftovers(svc: Service) -> list[str]:
    """Temporary files and folders anywhere in the artifact folder."""
    return [n for n in names(svc.artifact_dir) if n.endswith((".tmp", ".part"))]


def jsonl(size: int) -> bytes:
    line = b'{"prompt": "123=", "answer": "321"}\n'
    return line * (size // len(line) + 1)


def test_an_upload_larger_than_the_free_space_is_507_before_it_is_written(
    disk_service: Service, alice: httpx.Client
) -> None:
    answer = alice.post("/v1/files", files={"file": ("big.jsonl", jsonl(2 * MIB))})
    assert answer.status_code == 507, answer.text
    detail = answer.json()["detail"]
    assert re.match(r"file: the server has no room for \d+ more bytes \(\d+ free, 65536 ", detail)
    assert str(disk_service.artifact_dir) not in detail  # the server's paths are not the tenant's
    assert leftovers(disk_service) == []


def test_an_upload_that_fills_the_disk_while_written_is_507_and_leaves_nothing(
    disk_service: Service, alice: httpx.Client
) -> None:
    """No Content-Length (chunked): the disk fills during the write, and the cleanup's own close
    fails with ENOSPC too."""
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
        "Content-Type: application/x-ndjson\r\n\r\n"
    ).encode()
    body = jsonl(2 * MIB)

    def chunks() -> Iterator[bytes]:
        yield head
        for i in range(0, len(body), 64 * 1024):
            yield body[i : i + 64 * 1024]
        yield f"\r\n--{boundary}--\r\n".encode()

    answer = alice.post(
        "/v1/files",
        content=chunks(),
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert answer.status_code == 507, answer.text
    assert answer.json()["detail"].startswith("file: the server has no room left to store it")
    assert leftovers(disk_service) == []
    # the API is fine and the space is back: a small upload is stored
    small = alice.post("/v1/files", files={"file": ("s.jsonl", jsonl(1000))})
    assert small.status_code == 201, small.text


def test_readyz_stays_ready_and_says_the_disk_is_low_and_the_gauges_show_it(
    disk_service: Service,
) -> None:
    url = disk_service.base_url
    assert httpx.get(f"{url}/readyz", timeout=10).json() == {"status": "ok", "detail": None}
    filler = fill(disk_service.artifact_dir, leave=16 * 1024)
    try:
        ready = httpx.get(f"{url}/readyz", timeout=10)
        assert ready.status_code == 200
        detail = ready.json()["detail"]
        assert re.fullmatch(
            r"disk: low \(artifacts: \d+ bytes free, 65536 kept free; "
            r"uploads: \d+ bytes free, 65536 kept free\)",
            detail,
        ), detail
        text = httpx.get(f"{url}/metrics", timeout=10).text
        gauges = dict(re.findall(r'^(pdppo_disk_\w+\{folder="\w+"\}) (\S+)$', text, re.M))
        assert set(gauges) == {
            f'pdppo_disk_{kind}_bytes{{folder="{folder}"}}'
            for kind in ("free", "total")
            for folder in ("artifacts", "uploads")
        }
        assert float(gauges['pdppo_disk_total_bytes{folder="artifacts"}']) == MIB
        assert float(gauges['pdppo_disk_free_bytes{folder="uploads"}']) <= 24 * 1024
    finally:
        filler.unlink()
    text = httpx.get(f"{url}/metrics", timeout=10).text
    free = re.search(r'^pdppo_disk_free_bytes\{folder="artifacts"\} (\S+)$', text, re.M)
    assert free is not None and float(free.group(1)) > 900 * 1024  # read at each scrape


def test_a_job_with_no_room_for_its_first_checkpoint_is_refused_at_start(
    disk_service: Service, alice: httpx.Client
) -> None:
    filler = fill(disk_service.artifact_dir, leave=300 * 1024)
    try:
        job = alice.post("/v1/jobs", json=smoke_spec()).json()
        done = wait_status(alice, job["id"], TERMINAL)
    finally:
        filler.unlink()
    assert done["status"] == "failed", done
    assert done["error"]["code"] == "storage_full"
    message = done["error"]["message"]
    folder = disk_service.artifact_dir / job["id"]
    assert message.startswith(f"not enough free space in {folder} for the job's next checkpoint")
    free, needed = map(int, re.findall(r"(\d+) bytes free, (\d+) needed", message)[0])
    assert free < 310 * 1024 and needed > free
    assert done["progress"]["step"] == 0  # refused before it trained
    assert leftovers(disk_service) == []


def test_a_job_killed_mid_write_leaves_no_temp_folder_behind(
    disk_service: Service, alice: httpx.Client
) -> None:
    """Its worker removes what the killed process left half-written (planted here: a kill
    during the few milliseconds of a real save cannot be timed)."""
    job = alice.post("/v1/jobs", json=smoke_spec(steps=5000, checkpoint_every=0)).json()
    wait_for(alice, job["id"], lambda j: j["status"] == "running" and j["progress"]["step"] >= 1)
    folder = disk_service.artifact_dir / job["id"]
    for partial in (folder / "checkpoints" / "step-000001.tmp", folder / "final.tmp"):
        partial.mkdir(parents=True)
        (partial / "model.safetensors").write_bytes(b"\1" * 100_000)
    [pid] = job_pids(disk_service, job["id"])
    os.kill(pid, signal.SIGKILL)
    done = wait_status(alice, job["id"], TERMINAL)
    assert (done["status"], done["error"]["code"]) == ("failed", "killed"), done
    assert leftovers(disk_service) == []


def test_a_job_that_fills_the_disk_fails_storage_full_and_resumes_once_space_is_back(
    disk_service: Service, alice: httpx.Client
) -> None:
    """The smoke job's checkpoints are ~600 kB: the one of step 2 fits in 1 MiB, the one of
    step 4 beside it does not. The disk is then grown (as an operator frees space) and the job
    resumed from step 2."""
    job = alice.post("/v1/jobs", json=smoke_spec()).json()
    failed = wait_status(alice, job["id"], TERMINAL)
    assert failed["status"] == "failed", failed
    assert failed["error"]["code"] == "storage_full"
    assert "the checkpoint of step 4" in failed["error"]["message"]
    checkpoints = alice.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
    assert [c["step"] for c in checkpoints] == [2]
    assert leftovers(disk_service) == []

    subprocess.run(["mount", "-o", "remount,size=4m", str(disk_service.artifact_dir)], check=True)
    resumed = alice.post(f"/v1/jobs/{job['id']}/resume")
    assert resumed.status_code == 202, resumed.text
    assert resumed.json()["status"] == "queued" and resumed.json()["error"] is None
    done = wait_status(alice, job["id"], TERMINAL)
    assert done["status"] == "succeeded", done
    assert done["progress"] == {"step": 8, "total": 8}
    first = read_events(alice, job["id"])  # up to the failure's `done`
    rest = read_events(alice, job["id"], last_event_id=first[-1]["id"])
    statuses = [e["data"]["status"] for e in first + rest if e["event"] == "status"]
    assert statuses == ["queued", "running", "failed", "queued", "running", "succeeded"]
    logs = [e["data"]["message"] for e in rest if e["event"] == "log"]
    assert any(m.startswith("resumed from") and m.endswith("at step 2") for m in logs), logs
    model = alice.get(f"/v1/jobs/{job['id']}/model")
    assert model.status_code == 200
    assert leftovers(disk_service) == []


def test_resume_of_a_job_that_failed_for_another_reason_is_still_409(
    disk_service: Service, alice: httpx.Client
) -> None:
    job = alice.post("/v1/jobs", json=smoke_spec(steps=1)).json()
    assert wait_status(alice, job["id"], TERMINAL)["status"] == "succeeded"
    again = alice.post(f"/v1/jobs/{job['id']}/resume")
    assert again.status_code == 409


def test_the_upload_and_resume_statuses_are_documented(disk_service: Service) -> None:
    schema = httpx.get(f"{disk_service.base_url}/openapi.json", timeout=30).json()
    upload = schema["paths"]["/v1/files"]["post"]["responses"]
    parts = upload["507"]["content"]["application/json"]["schema"]["allOf"]  # + OpenAI's error
    assert [p["$ref"].rsplit("/", 1)[1] for p in parts] == ["ErrorBody", "OpenAIErrorBody"]
    resume = schema["paths"]["/v1/jobs/{job_id}/resume"]["post"]["responses"]
    assert {"202", "409", "429"} <= set(resume)
    assert "storage_full" in resume["409"]["description"]
