"""What a user does with the deployed stack, from the host: submit with the CLI and follow it,
download checkpoints, upload a dataset, train on their own model and data from the data folder,
open the dashboard; and what they must never meet: a container running as root, an API that
starts in production without keys."""

from __future__ import annotations

import json
import re
import tarfile
import time
from pathlib import Path

import httpx

from pdppo.client import Client
from tests.compose.stack import REPO, Stack, default_services, wait_job
from tests.support.specs import records, smoke_spec
from tests.support.waits import metric_steps, read_events
from tests.support.webhook_receiver import Receiver


def test_the_smoke_job_submitted_from_the_host_cli_succeeds_streams_and_downloads(
    stack: Stack, alice: httpx.Client, tmp_path: Path
) -> None:
    out = stack.cli("submit", str(REPO / "examples" / "smoke.yaml"), "--follow")
    job_id, status = out.strip().splitlines()[-1].split()
    assert status == "succeeded", out

    events = read_events(alice, job_id)
    assert metric_steps(events) == list(range(1, 9))
    statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
    assert statuses == ["queued", "running", "succeeded"]
    assert events[-1]["event"] == "done"

    with Client(stack.url, stack.keys["alice"]) as client:
        listing = client.checkpoints(job_id)
        assert [c.name for c in listing.items] == ["step-000006", "step-000008"]
        for name in ("step-000008", "final"):
            saved = client.download(job_id, name, tmp_path)
            with tarfile.open(saved) as tar:
                files = {Path(n).name for n in tar.getnames()}
            assert "model.safetensors" in files or "model.pt" in files, (name, files)


def test_a_dataset_uploaded_through_the_files_api_trains(alice: httpx.Client) -> None:
    uploaded = alice.post("/v1/files", files={"file": ("digits.jsonl", records(40))})
    assert uploaded.status_code == 201, uploaded.text
    spec = smoke_spec(steps=3, checkpoint_every=0)
    spec["train"]["task"] = {"name": "jsonl", "file": uploaded.json()["id"]}
    job = alice.post("/v1/jobs", json=spec)
    assert job.status_code == 201, job.text
    done = wait_job(alice, job.json()["id"])
    assert done["status"] == "succeeded", done
    assert done["progress"] == {"step": 3, "total": 3}


def test_a_model_and_dataset_in_the_data_folder_train_and_the_mount_is_read_only(
    stack: Stack, alice: httpx.Client
) -> None:
    from core.models.local_hf import make_chat_hf

    folder = stack.data_dir / "own"
    make_chat_hf(folder / "model")
    (folder / "prompts.jsonl").write_bytes(records(24))
    for path in [folder, *folder.rglob("*")]:  # the workers' user is not the host's
        path.chmod(0o755 if path.is_dir() else 0o644)

    spec = smoke_spec(steps=2, checkpoint_every=0)
    spec["train"]["model"] = {"name": "hf:/data/own/model"}
    spec["train"]["task"] = {"name": "jsonl", "path": "/data/own/prompts.jsonl"}
    job = alice.post("/v1/jobs", json=spec)
    assert job.status_code == 201, job.text
    done = wait_job(alice, job.json()["id"])
    assert done["status"] == "succeeded", done

    refused = stack.exec("worker-cpu", "touch", "/data/own/written", check=False)
    assert "Read-only file system" in refused, refused
    assert not (folder / "written").exists()


def test_no_container_runs_as_root(stack: Stack, alice: httpx.Client) -> None:
    for service in ("redis", "api", "worker-cpu"):
        assert stack.exec(service, "id", "-u").strip() != "0", service
    # the job processes too: every process in the worker container (the images have no ps)
    owners = stack.exec(
        "worker-cpu", "sh", "-c", "for s in /proc/[0-9]*/status; do grep ^Uid: $s; done"
    )
    uids = {line.split()[1] for line in owners.splitlines() if line.startswith("Uid:")}
    assert uids and "0" not in uids, owners


def test_every_setting_in_deploy_env_reaches_the_services(stack: Stack) -> None:
    """Compose hands a container only the variables it lists, whatever deploy/.env holds
    (tests/deploy/test_compose.py holds the list to .env.example): .ci/compose's .env sets two
    that compose once left out (retention, the API's connection limit) beside the usual ones."""
    written = dict(re.findall(r"^(PDPPO_\w+)=(.*)$", stack.env_file.read_text(), re.MULTILINE))
    assert {"PDPPO_RETENTION_DAYS", "PDPPO_HTTP_MAX_CONNECTIONS"} <= set(written)
    probe = "from pdppo.settings import get_settings as g; print(g().retention_days)"
    for service in ("api", "worker-cpu", "webhooks"):
        seen = {name: stack.exec(service, "printenv", name).strip() for name in written}
        assert seen == written, service
        assert float(stack.exec(service, "python", "-c", probe)) == 45.0, service


def test_the_api_refuses_to_start_in_production_without_keys(stack: Stack) -> None:
    for keys, says in (("", "PDPPO_API_KEYS must be set"), ("team:short", "shorter than")):
        done = stack.run(
            "run", "--rm", "--no-deps", "-e", f"PDPPO_API_KEYS={keys}", "api", check=False
        )
        assert done.returncode != 0, done.stdout
        assert says in done.stdout + done.stderr, done.stdout + done.stderr


def test_the_dashboard_and_every_file_it_loads_come_from_the_container(
    alice: httpx.Client,
) -> None:
    page = alice.get("/", follow_redirects=True)
    assert page.status_code == 200
    assert page.url.path == "/ui/", page.url
    assert "<html" in page.text.lower()
    assets = re.findall(r'(?:src|href)="([^"#:]+\.(?:js|css))"', page.text)
    assert assets == [
        "vendor/uPlot.min.css",
        "app.css",
        "vendor/uPlot.iife.min.js",
        "vendor/js-yaml.umd.min.js",
        "charts.js",
        "job.js",
        "experiment.js",
        "app.js",
    ]
    for asset in assets:
        response = alice.get(f"/ui/{asset}")
        assert response.status_code == 200, asset
        assert len(response.content) > 1000, asset
    external = re.findall(r'(?:src|href)="(https?://[^"]+)"', page.text)
    assert external == [], external
    # the API docs' Swagger UI and ReDoc are vendored in the image too (api/docs.py)
    for docs, count in (("/docs", 3), ("/redoc", 2)):  # css, js, favicon; js, favicon
        html = alice.get(docs).text
        files = re.findall(r'(?:src|href)="(/ui/vendor/[^"]+)"', html)
        assert len(files) == count, (docs, files)
        assert all(alice.get(f).status_code == 200 for f in files), files
        assert re.findall(r'(?:src|href)="(https?://[^"]+)"', html) == [], docs


def test_the_default_set_is_up_and_healthy_and_no_gpu_worker_was_started(stack: Stack) -> None:
    """The docs' plain `up -d --build`, on a machine without a GPU: every service of the default
    set healthy, the GPU workers (profile `gpu`) neither built nor started. Before the profiles,
    that command failed on `Service 'worker-gpu' needs to be built`, and the docs' list of
    services left `sample` out."""
    assert default_services() == ("redis", "api", "worker-cpu", "webhooks", "sample")
    stack.wait_healthy()
    assert {service: stack.health(service) for service in default_services()} == dict.fromkeys(
        default_services(), "healthy"
    )
    assert stack.run("ps", "-q", "worker-gpu").stdout.split() == []
    assert stack.run("ps", "-q", "flower").stdout.split() == []


def test_pdppo_sample_answers_from_the_sample_service(stack: Stack, alice: httpx.Client) -> None:
    """`pdppo sample` on a succeeded job is answered by the `sample` service of the default set
    (without it the API waits PDPPO_SAMPLE_TIMEOUT_SECONDS, 60, and answers 504)."""
    job = alice.post("/v1/jobs", json=smoke_spec(steps=2, checkpoint_every=0))
    assert job.status_code == 201, job.text
    assert wait_job(alice, job.json()["id"])["status"] == "succeeded"
    asked = time.monotonic()
    options = ["--json", "--max-tokens", "4", "--temperature", "0"]
    out = stack.cli("sample", job.json()["id"], "reverse 123=", *options, timeout=120)
    took = time.monotonic() - asked
    answer = json.loads(out)
    assert answer["usage"]["prompt_tokens"] == 13  # "reverse 123=" byte by byte, and BOS
    assert [c["tokens"] <= 4 for c in answer["choices"]] == [True]
    assert answer["model"] == f"job:{job.json()['id']}"
    assert took < 60, took  # an answer, not the 504 after PDPPO_SAMPLE_TIMEOUT_SECONDS


def test_the_images_have_the_tracker_extras(stack: Stack) -> None:
    """`train.report_to` on the workers of the images: TensorBoard, MLflow's client and W&B
    import in the CPU image (the images lacked the `trackers` extra)."""
    probe = "import mlflow, tensorboard, wandb; print(tensorboard.__version__, wandb.__version__)"
    out = stack.exec("worker-cpu", "python", "-c", probe).split()
    pins = dict(
        line.split("==")
        for line in (REPO / "deploy" / "constraints.txt").read_text().splitlines()
        if "==" in line
    )
    assert out == [pins["tensorboard"], pins["wandb"]]


def test_a_webhook_reaches_a_receiver_on_the_host_through_host_docker_internal(
    stack: Stack, alice: httpx.Client
) -> None:
    """The webhooks service delivers from its container to a receiver on the host, registered as
    `http://host.docker.internal:<port>` (extra_hosts: host-gateway), the one address the
    operator allows (.ci/compose sets PDPPO_WEBHOOK_ALLOWED_NETWORKS to it, as the docs say).
    The compose network's gateway address, used before, changes on every `down`/`up`."""
    from standardwebhooks import Webhook

    receiver = Receiver()
    receiver.start(host="0.0.0.0")
    try:
        port = receiver.url.rsplit(":", 1)[1]
        url = f"http://host.docker.internal:{port}/ok"
        made = alice.post("/v1/webhooks", json={"url": url, "events": ["job.cancelled"]})
        assert made.status_code == 201, made.text
        job = alice.post("/v1/jobs", json=smoke_spec(steps=500)).json()["id"]
        alice.post(f"/v1/jobs/{job}/cancel")
        deadline = time.monotonic() + 120
        while not receiver.at("/ok") and time.monotonic() < deadline:
            time.sleep(0.2)
        got = receiver.at("/ok")
    finally:
        receiver.stop()
    assert len(got) == 1, f"the receiver got {len(got)} requests"
    body = Webhook(made.json()["secret"]).verify(got[0].body, got[0].headers)
    assert (body["type"], body["data"]["id"], body["data"]["status"]) == (
        "job.cancelled",
        job,
        "cancelled",
    )
    # any other private address stays refused: the allowlist is that one address
    elsewhere = alice.post("/v1/webhooks", json={"url": "http://10.1.2.3:8080/ok"})
    assert elsewhere.status_code == 400, elsewhere.text
