"""Budgets at submit, on the real API: a spec that would exhaust a worker is a 422 naming the
field, the estimate and the limit, and `POST /v1/jobs:validate` answers the same question
without creating anything.

The poison specs of issue 8 were all accepted (201) before: a 1,000,000-completion group (5.5 GB
held at step 0), 1e9 x 1e9 completions (the worker grew until the kernel killed it) and a
13B-parameter builtin:tiny (OOM-killed within 40 s). Stricter schema validation now refuses
the first two by their bounds; in-bounds variants show that the budget refuses what the bounds
let through. Expected messages are computed here with `core.budget` from the same spec, so a
test fails when the server's figures or wording drift from the library's.

A poison spec accepted by mistake must not reach the shared CPU worker: on the shared service
they go to the gpu queue (no GPU worker runs in the tests), and the cpu-queue cases run against
an API started without any worker.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from core.budget import GIB, check, estimate, format_bytes
from core.models.local_hf import make_tiny_hf
from pdppo.settings import Settings
from pdppo.spec import JobSpec
from tests.support.specs import smoke_spec
from tests.support.stack import Service

TINY_13B = {"tiny": {"d_model": 4096, "n_layers": 64, "n_heads": 64, "max_seq_len": 8192}}
# (label, spec, field the 422 must name): the specs verbatim, then in-bounds variants
POISONS: list[tuple[str, dict[str, Any], str]] = [
    ("group 1e6", {"train": {"steps": 2, "rollout": {"group_size": 1000000}}}, "group_size"),
    (
        "1e9 x 1e9",
        {"train": {"rollout": {"prompts_per_step": 1e9, "group_size": 1e9}}},
        "train.rollout.",
    ),
    ("13B tiny", {"train": {"model": TINY_13B}}, "train.model.tiny"),
    (
        "32 x 4096",
        {"train": {"steps": 2, "rollout": {"prompts_per_step": 32, "group_size": 4096}}},
        "train.rollout.group_size",
    ),
    (
        "65536 x 4096",
        {"train": {"rollout": {"prompts_per_step": 65536, "group_size": 4096}}},
        "train.rollout.prompts_per_step",
    ),
]


# 131,072 sequences of the default tiny model need about 18 GiB: too much for a CPU worker, fine
# on an 80 GB GPU (16 x 4096 fit a CPU worker since the estimate counts each prompt once and the
# largest phase alone, issue 49: 9.2 GiB)
GPU_POISONS = [p for p in POISONS if p[0] != "32 x 4096"]


def on_queue(spec: dict[str, Any], queue: str) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    out["name"] = "budget"
    out["resources"] = {"device": queue}
    return out


def budget_detail(spec: dict[str, Any], settings: Settings | None = None) -> str | None:
    """What POST /v1/jobs must answer for `spec` when its schema is valid (None when not)."""
    try:
        parsed = JobSpec.model_validate(spec)
    except ValidationError:
        return None
    settings = settings or Settings(_env_file=None)  # type: ignore[call-arg]
    queue = parsed.resources.device
    problems = check(estimate(parsed.train, queue=queue), settings.budget_limits(queue))
    assert problems, "a poison spec the budget takes: the test's premise is wrong"
    return "; ".join(str(p) for p in problems)


def post(client: httpx.Client, spec: dict[str, Any]) -> httpx.Response:
    response = client.post("/v1/jobs", json=spec)
    if response.status_code == 201:  # never expected: leave no job behind
        client.post(f"/v1/jobs/{response.json()['id']}/cancel")
    return response


def assert_refused(response: httpx.Response, spec: dict[str, Any], field: str) -> str:
    assert response.status_code == 422, response.text
    detail: str = response.json()["detail"]
    expected = budget_detail(spec)
    if expected is None:  # refused by the schema's own bounds, which name the field too
        assert field in detail.split(":", 1)[0] or f"; {field}" in detail, detail
    else:
        assert detail == expected
        assert detail.startswith(f"{field}: ") or f"; {field}: " in detail, detail
    return detail


@pytest.mark.parametrize(("label", "spec", "field"), GPU_POISONS, ids=[p[0] for p in GPU_POISONS])
def test_poison_spec_is_refused_on_the_gpu_queue(
    alice: httpx.Client, label: str, spec: dict[str, Any], field: str
) -> None:
    assert_refused(post(alice, on_queue(spec, "gpu")), on_queue(spec, "gpu"), field)


def test_poison_specs_are_refused_on_the_cpu_queue_with_estimate_and_limit(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service()
    svc.start_api()  # and no worker: nothing accepted here could ever run
    with svc.client("alice") as alice:
        details = {
            label: assert_refused(post(alice, on_queue(spec, "cpu")), on_queue(spec, "cpu"), field)
            for label, spec, field in POISONS
        }
    # the 13B model: 241 GiB estimated (16 bytes per parameter before any activation)
    thirteen_b = details["13B tiny"]
    assert thirteen_b.startswith("train.model.tiny: the job would need about 241 GiB of memory ")
    assert "(limit 12 GiB on cpu workers)" in thirteen_b
    assert "train.model.tiny: the model has about 12.9B parameters (limit 1B on cpu workers)" in (
        thirteen_b
    )
    wide = details["32 x 4096"]
    assert wide.startswith("train.rollout.group_size: the job would need about ")
    assert wide.endswith(" of memory (limit 12 GiB on cpu workers)")
    assert "a step would process about 5.9B tokens (limit 16M per step)" in details["65536 x 4096"]
    with svc.client("alice") as alice:  # the same batch has room on a GPU worker
        gpu = alice.post("/v1/jobs", json=on_queue(POISONS[3][1], "gpu"))
        assert gpu.status_code == 201, gpu.text
        alice.post(f"/v1/jobs/{gpu.json()['id']}/cancel")


def test_the_gpu_checks_0_8b_llama_is_taken_on_the_gpu_queue(
    alice: httpx.Client, service: Service
) -> None:
    """bench/gpu_check.py's 0.8B Llama with the fused loss, under the default GPU limit (70
    GiB): the API took its estimate for 106 GiB (the [tokens, vocabulary] logits that the fused
    loss never holds counted) and refused it, 422, though an 80 GB GPU runs it. Its
    config.json and tokenizer alone, under the data root: the API reads no weights."""
    from bench.gpu_check import GPU, estimated_spec

    train = estimated_spec(service.data_dir / "gpu-check-0.8b", GPU, cuda=True)
    spec = {"name": "gpu-check", "resources": {"device": "gpu"}, "train": train}
    body = alice.post("/v1/jobs:validate", json=spec).json()
    assert body["ok"] is True, body["problems"]
    est = body["estimate"]
    assert (est["device"], est["params"], est["fused_loss"]) == ("cuda", 796_706_304, True)
    assert (
        est["peak_memory_bytes"]
        == estimate(JobSpec.model_validate(spec).train, queue="gpu").peak_memory_bytes
    )
    assert est["peak_memory_bytes"] < body["limits"]["max_memory_bytes"] == 70 * GIB
    created = alice.post("/v1/jobs", json=spec)  # no GPU worker here: it waits, then is cancelled
    assert created.status_code == 201, created.text
    alice.post(f"/v1/jobs/{created.json()['id']}/cancel")


def test_validate_answers_the_estimate_of_a_spec_that_fits(alice: httpx.Client) -> None:
    before = alice.get("/v1/jobs", params={"limit": 100}).json()["items"]
    response = alice.post("/v1/jobs:validate", json=smoke_spec())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ok"] is True and body["problems"] == []
    est = body["estimate"]
    # builtin:tiny d=32, 1 layer, 32 positions: 2*512*32 + 32*32 + 12*32^2 + 13*32 + 2*32
    assert (est["params"], est["trainable_params"]) == (46_560, 46_560)
    # "reverse 123=" + BOS = 13 tokens, + 4 new; 4 prompts x 4 completions; 8 steps
    assert (est["prompt_tokens"], est["sequence_tokens"], est["tokens_per_step"]) == (13, 17, 272)
    assert est["total_tokens"] == 2176
    assert (est["queue"], est["device"]) == ("cpu", "cpu")
    local = estimate(JobSpec.model_validate(smoke_spec()).train)
    assert est["peak_memory_bytes"] == local.peak_memory_bytes
    assert 100 * 2**20 < est["peak_memory_bytes"] < 512 * 2**20
    weights = next(m for m in est["memory"] if m["name"] == "weights")
    assert weights == {
        "name": "weights",
        "phase": "persistent",
        "bytes": 4 * 46_560,
        "field": "train.model.tiny",
        "at_peak": True,
    }
    assert body["limits"] == {
        "queue": "cpu",
        "max_memory_bytes": 12 * GIB,
        "max_params": 1_000_000_000,
        "max_tokens_per_step": 16_000_000,
        "max_total_tokens": 50_000_000_000,
    }
    after = alice.get("/v1/jobs", params={"limit": 100}).json()["items"]
    assert [j["id"] for j in after] == [j["id"] for j in before]  # nothing was created


def test_validate_lists_every_problem_without_creating_anything(
    alice: httpx.Client, service: Service
) -> None:
    before = alice.get("/v1/jobs", params={"limit": 100}).json()["items"]
    spec = on_queue({"train": {"model": TINY_13B}}, "cpu")
    body = alice.post("/v1/jobs:validate", json=spec).json()
    assert body["ok"] is False
    memory, params = body["problems"]
    assert (memory["field"], memory["kind"], memory["limit"]) == (
        "train.model.tiny",
        "memory",
        12 * GIB,
    )
    assert memory["estimate"] == estimate(JobSpec.model_validate(spec).train).peak_memory_bytes
    assert memory["message"] == (
        f"train.model.tiny: the job would need about {format_bytes(memory['estimate'])} of "
        "memory (limit 12 GiB on cpu workers)"
    )
    assert (params["kind"], params["estimate"], params["limit"]) == (
        "params",
        12_926_066_688,
        1_000_000_000,
    )
    assert body["estimate"]["params"] == 12_926_066_688
    assert post(alice, spec).json()["detail"] == f"{memory['message']}; {params['message']}"

    outside = on_queue(smoke_spec(), "cpu")
    outside["train"]["task"] = {"name": "jsonl", "path": str(service.artifact_dir / "x.jsonl")}
    body = alice.post("/v1/jobs:validate", json=outside).json()
    assert body["ok"] is False
    [problem] = body["problems"]
    assert (problem["field"], problem["kind"]) == ("train.task.path", "path")
    assert "not under any of the allowed data roots" in problem["message"]
    # the dataset is not read: prompts are bounded by the model's 32 positions less 4 new
    assert body["estimate"]["prompt_tokens"] == 28
    after = alice.get("/v1/jobs", params={"limit": 100}).json()["items"]
    assert [j["id"] for j in after] == [j["id"] for j in before]


def test_validate_needs_a_key_and_a_valid_spec(service: Service, alice: httpx.Client) -> None:
    with service.client(None) as anonymous:
        assert anonymous.post("/v1/jobs:validate", json=smoke_spec()).status_code == 401
    spec = smoke_spec()
    spec["train"]["stepz"] = 3
    invalid = alice.post("/v1/jobs:validate", json=spec)
    assert invalid.status_code == 422
    assert invalid.json()["detail"].startswith("train.stepz: ")
    assert invalid.json()["errors"][0]["loc"][0] == "body"
    assert alice.get("/v1/jobs:validate").status_code == 405
    schema = alice.get("/openapi.json").json()["paths"]
    assert sorted(schema["/v1/jobs:validate"]["post"]["responses"]) == [
        "200",
        "400",
        "401",
        "413",
        "422",
        "500",
        "503",  # it reads Redis when the spec names uploaded files (train.task.file)
    ]
    assert {"201", "401", "409", "413", "422", "429", "503"} <= set(
        schema["/v1/jobs"]["post"]["responses"]
    )


def test_a_limit_from_the_environment_refuses_the_smoke_spec(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service(PDPPO_MAX_JOB_MEMORY_GB_CPU="0.001")
    svc.start_api()  # no worker: the gpu job below stays queued until cancelled
    limited = Settings(_env_file=None, max_job_memory_gb_cpu=0.001)  # type: ignore[call-arg]
    spec = smoke_spec()
    expected = budget_detail(spec, limited)
    assert expected is not None
    with svc.client("alice") as alice:
        refused = post(alice, spec)
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"] == expected
        assert expected.endswith(" of memory (limit 1 MiB on cpu workers)")
        peak = JobSpec.model_validate(spec)
        assert f"about {format_bytes(estimate(peak.train).peak_memory_bytes or 0)} " in expected
        body = alice.post("/v1/jobs:validate", json=spec).json()
        assert body["ok"] is False and body["limits"]["max_memory_bytes"] == int(0.001 * GIB)
        assert [p["kind"] for p in body["problems"]] == ["memory"]
        other_queue = alice.post("/v1/jobs", json=on_queue(spec, "gpu"))  # its own limits
        assert other_queue.status_code == 201, other_queue.text
        alice.post(f"/v1/jobs/{other_queue.json()['id']}/cancel")


def test_a_rollout_engine_the_workers_lack_is_refused_at_submit_naming_the_extra(
    make_service: Callable[..., Service],
) -> None:
    """vLLM rollouts need the `vllm` extra in the workers: a server whose workers lack it says
    so at submit (422), instead of a job that fails once a worker starts it. The API is told
    which engines its workers offer (PDPPO_ROLLOUT_ENGINES; by default what it can import)."""
    svc = make_service(PDPPO_ROLLOUT_ENGINES='["hf"]')
    svc.start_api()  # no worker: nothing here trains
    model = make_tiny_hf(svc.data_dir / "llama")
    spec = smoke_spec()
    spec["train"]["model"] = {"name": f"hf:{model}"}
    spec["train"]["rollout"]["engine"] = "vllm"
    message = (
        "train.rollout.engine: 'vllm' is not offered by this server's workers (they offer "
        "['hf']); vLLM rollouts need the `vllm` extra (pip install 'pdppo[vllm]') in the "
        "workers, and the API told with PDPPO_ROLLOUT_ENGINES"
    )
    with svc.client("alice") as alice:
        refused = post(alice, spec)
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"] == message
        body = alice.post("/v1/jobs:validate", json=spec).json()
        assert [(p["field"], p["kind"]) for p in body["problems"]] == [
            ("train.rollout.engine", "engine")
        ]
        spec["train"]["rollout"]["engine"] = "hf"
        assert alice.post("/v1/jobs:validate", json=spec).json()["ok"] is True
        # a spec vLLM cannot serve at all is refused by validation, whatever the workers have
        spec["train"]["rollout"]["engine"] = "vllm"
        spec["train"]["model"] = {"name": "builtin:tiny"}
        invalid = post(alice, spec)
        assert invalid.status_code == 422
        assert "rollout.engine='vllm' needs a Hugging Face model" in invalid.json()["detail"]


def test_the_worker_checks_the_budget_again_before_loading_anything(
    make_service: Callable[..., Service],
) -> None:
    """An operator lowered the CPU limit while a job waited in the queue: the worker refuses it
    with the same words the API would have used, instead of trying and running out of memory."""
    svc = make_service()
    svc.start_api()
    with svc.client("alice") as alice:
        spec = smoke_spec()
        created = alice.post("/v1/jobs", json=spec)
        assert created.status_code == 201, created.text
        svc.env["PDPPO_MAX_JOB_MEMORY_GB_CPU"] = "0.001"
        svc.start_worker()
        job = created.json()
        deadline = time.monotonic() + 60
        while (job := alice.get(f"/v1/jobs/{job['id']}").json())["status"] != "failed":
            assert job["status"] in ("queued", "running") and time.monotonic() < deadline, job
            time.sleep(0.1)
    assert job["error"]["code"] == "over_budget"
    expected = budget_detail(spec, Settings(_env_file=None, max_job_memory_gb_cpu=0.001))  # type: ignore[call-arg]
    assert expected is not None and job["error"]["message"] == expected
    assert job["attempts"] == 1 and job["progress"]["step"] == 0
