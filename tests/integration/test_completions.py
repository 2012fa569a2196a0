"""Trying a tuned model from the service on the real stack: redis-server, `pdppo serve`, a
training worker (queue `cpu`) and `pdppo sample-worker` (queue `sample`). Completions of a
succeeded `builtin:tiny` job by the native route and by the OpenAI SDK's
`client.chat.completions.create`, the same texts a local load of the job's final model gives,
the 404/409 cases, another tenant's 404, and a completion answered while a training job holds
the only training worker. The limits (per-tenant concurrency 429, timeout 504) run on a second
service with no sample worker, so that a request stays in flight for as long as the test needs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import redis
import torch
from openai import OpenAI

from core.config import ModelConfig
from core.models import load_model
from core.rollout.completions import complete
from tests.support.specs import smoke_spec
from tests.support.stack import (
    KEYS,
    REDIS_DATABASES,
    RedisServer,
    Service,
    check_compose_healthcheck,
)
from tests.support.waits import wait_for, wait_status
from workers.sample_app import active_key

LONG = {"steps": 5000, "checkpoint_every": 0}
CHAT = [{"role": "user", "content": "12="}]


def _extra_service(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, **env: str
) -> Service:
    """A service on a database no other service of this run uses (as `make_service` picks)."""
    db = 1 + len(list(tmp_path_factory.getbasetemp().glob("extra*")))
    assert db < REDIS_DATABASES
    return Service(redis_server, tmp_path_factory.mktemp("extra"), db=db, env=env)


def _succeeded_job(client: httpx.Client) -> str:
    job = client.post("/v1/jobs", json=smoke_spec(steps=2)).json()
    wait_status(client, job["id"], "succeeded", timeout=120)
    return str(job["id"])


@pytest.fixture(scope="module")
def sampled(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, str]]:
    """A service with a training worker and a sample worker, and a succeeded job of alice's."""
    svc = _extra_service(redis_server, tmp_path_factory)
    try:
        svc.start_api()
        svc.start_worker("cpu")
        svc.start_sample_worker()
        with svc.client("alice") as alice:
            job_id = _succeeded_job(alice)
        yield svc, job_id
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def unserved(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, str]]:
    """No sample worker, one request in flight per tenant, and a 2 s timeout."""
    svc = _extra_service(
        redis_server,
        tmp_path_factory,
        PDPPO_SAMPLE_TIMEOUT_SECONDS="2",
        PDPPO_SAMPLE_MAX_CONCURRENT_PER_TENANT="1",
    )
    try:
        svc.start_api()
        svc.start_worker("cpu")
        with svc.client("alice") as alice:
            job_id = _succeeded_job(alice)
        yield svc, job_id
    finally:
        svc.stop()


def local_greedy(svc: Service, job_id: str, prompt_ids: list[int], max_tokens: int) -> str:
    """What the job's final model says, loaded here with the trainer's code."""
    folder = svc.artifact_dir / job_id / "final"
    lm = load_model(ModelConfig(name=f"job:{job_id}"), torch.device("cpu"), model_dir=folder)
    lm.module.eval()
    return complete(lm, prompt_ids, max_tokens=max_tokens, temperature=0).choices[0].text


def test_completions_of_a_succeeded_job(sampled: tuple[Service, str]) -> None:
    svc, job_id = sampled
    with svc.client("alice") as alice:
        body = {"prompt": "12=", "max_tokens": 6, "temperature": 0}
        first = alice.post(f"/v1/jobs/{job_id}/completions", json=body)
        assert first.status_code == 200, first.text
        again = alice.post(f"/v1/jobs/{job_id}/completions", json=body)
    one, two = first.json(), again.json()
    assert (one["cold"], two["cold"]) == (True, False)  # the worker keeps the model loaded
    assert one["model"] == f"job:{job_id}" and one["job_id"] == job_id
    # BOS + 3 bytes; greedy: the same text as the final model loaded here, twice
    assert one["usage"]["prompt_tokens"] == 4
    from core.models.tiny import ByteTokenizer

    expected = local_greedy(svc, job_id, ByteTokenizer().encode_prompt("12="), 6)
    assert [c["text"] for c in one["choices"]] == [expected]
    assert [c["text"] for c in two["choices"]] == [expected]
    choice = one["choices"][0]
    assert one["usage"]["completion_tokens"] == choice["tokens"]
    assert one["usage"]["total_tokens"] == 4 + choice["tokens"]
    assert choice["finish_reason"] == ("length" if choice["tokens"] == 6 else "stop")


def test_seeded_samples_repeat_and_n_gives_n(sampled: tuple[Service, str]) -> None:
    svc, job_id = sampled
    body = {"messages": CHAT, "max_tokens": 5, "n": 3, "seed": 7, "temperature": 1.0}
    with svc.client("alice") as alice:
        a = alice.post(f"/v1/jobs/{job_id}/completions", json=body).json()
        b = alice.post(f"/v1/jobs/{job_id}/completions", json=body).json()
    assert [c["index"] for c in a["choices"]] == [0, 1, 2]
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]
    # "user: 12=\nassistant: " after BOS: the tiny model's chat layout
    assert a["usage"]["prompt_tokens"] == 1 + len("user: 12=\nassistant: ")


def test_limits_and_bad_requests(sampled: tuple[Service, str]) -> None:
    svc, job_id = sampled
    url = f"/v1/jobs/{job_id}/completions"
    with svc.client("alice") as alice:
        too_many = alice.post(url, json={"prompt": "1", "max_tokens": 257})
        assert too_many.status_code == 422
        assert "PDPPO_SAMPLE_MAX_TOKENS" in too_many.json()["detail"]
        wide = alice.post(url, json={"prompt": "1", "n": 5})
        assert wide.status_code == 422 and "PDPPO_SAMPLE_MAX_N" in wide.json()["detail"]
        both = alice.post(url, json={"prompt": "1", "messages": CHAT})
        assert both.status_code == 422
        # the model's context is 32 tokens: a 40-byte prompt leaves no room
        long = alice.post(url, json={"prompt": "9" * 40})
        assert long.status_code == 400 and "no room" in long.json()["detail"]


def test_not_succeeded_missing_and_other_tenants(sampled: tuple[Service, str]) -> None:
    svc, job_id = sampled
    with svc.client("alice") as alice, svc.client("bob") as bob:
        other = bob.post(f"/v1/jobs/{job_id}/completions", json={"prompt": "1"})
        assert other.status_code == 404, other.text
        assert bob.post("/v1/jobs/nope/completions", json={"prompt": "1"}).status_code == 404
        running = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
        try:
            wait_status(alice, running["id"], "running")
            busy = alice.post(f"/v1/jobs/{running['id']}/completions", json={"prompt": "1"})
            assert busy.status_code == 409
            assert busy.json()["detail"] == (
                f"job {running['id']!r} is running: only a succeeded job has a model to try"
            )
        finally:
            alice.post(f"/v1/jobs/{running['id']}/cancel")
            wait_status(alice, running["id"], "cancelled", timeout=60)
        final = svc.artifact_dir / job_id / "final"
        aside = final.with_name("final-aside")
        final.rename(aside)
        try:
            gone = alice.post(f"/v1/jobs/{job_id}/completions", json={"prompt": "1"})
            assert gone.status_code == 404
            assert "no final model" in gone.json()["detail"]
        finally:
            aside.rename(final)


def test_a_completion_is_not_held_behind_a_training_job(sampled: tuple[Service, str]) -> None:
    """The one training worker runs a long job; the completion still answers, while the job
    is still running (separate queues, separate workers)."""
    svc, job_id = sampled
    with svc.client("alice") as alice:
        long = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
        try:
            wait_for(
                alice, long["id"], lambda j: j["status"] == "running" and j["progress"]["step"] >= 1
            )
            started = time.monotonic()
            answer = alice.post(
                f"/v1/jobs/{job_id}/completions", json={"prompt": "3=", "max_tokens": 4}
            )
            took = time.monotonic() - started
            assert answer.status_code == 200, answer.text
            assert alice.get(f"/v1/jobs/{long['id']}").json()["status"] == "running"
            assert took < 20
        finally:
            alice.post(f"/v1/jobs/{long['id']}/cancel")
            wait_status(alice, long["id"], "cancelled", timeout=60)


def test_the_openai_sdk_chats_with_the_tuned_model(sampled: tuple[Service, str]) -> None:
    svc, job_id = sampled
    with OpenAI(base_url=f"{svc.base_url}/v1", api_key=KEYS["alice"], max_retries=0) as client:
        chat = client.chat.completions.create(
            model=f"job:{job_id}",
            messages=CHAT,
            max_tokens=5,
            seed=7,
            n=2,  # type: ignore[arg-type]
        )
        with pytest.raises(openai.NotFoundError) as unknown:
            client.chat.completions.create(model="gpt-4o", messages=CHAT)  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError) as limit:
            client.chat.completions.create(
                model=f"job:{job_id}",
                messages=CHAT,
                max_tokens=1000,  # type: ignore[arg-type]
            )
    bob = OpenAI(base_url=f"{svc.base_url}/v1", api_key=KEYS["bob"], max_retries=0)
    with bob, pytest.raises(openai.NotFoundError):
        bob.chat.completions.create(model=f"job:{job_id}", messages=CHAT)  # type: ignore[arg-type]
    assert chat.object == "chat.completion" and chat.model == f"job:{job_id}"
    assert chat.id.startswith("chatcmpl-")
    with svc.client("alice") as alice:
        native = alice.post(
            f"/v1/jobs/{job_id}/completions",
            json={"messages": CHAT, "max_tokens": 5, "seed": 7, "n": 2},
        ).json()
    assert [c.message.content for c in chat.choices] == [c["text"] for c in native["choices"]]
    assert [c.finish_reason for c in chat.choices] == [
        c["finish_reason"] for c in native["choices"]
    ]
    assert chat.usage is not None and chat.usage.prompt_tokens == native["usage"]["prompt_tokens"]
    assert unknown.value.body["code"] == "not_found"  # type: ignore[index]
    assert "PDPPO_SAMPLE_MAX_TOKENS" in limit.value.body["message"]  # type: ignore[index]


def test_no_answer_in_time_is_a_504(unserved: tuple[Service, str]) -> None:
    svc, job_id = unserved
    with svc.client("alice") as alice:
        started = time.monotonic()
        late = alice.post(f"/v1/jobs/{job_id}/completions", json={"prompt": "1"})
        took = time.monotonic() - started
    assert late.status_code == 504
    assert "no sample worker answered within 2 s" in late.json()["detail"]
    assert 2 <= took < 10


def test_a_tenants_concurrent_requests_are_limited(unserved: tuple[Service, str]) -> None:
    """With one request of alice's in flight, her second is refused at once (429); bob's is
    not (his own count), and once hers has ended, she may send again."""
    svc, job_id = unserved
    url = f"/v1/jobs/{job_id}/completions"
    statuses: list[int] = []
    conn = redis.Redis.from_url(svc.redis_url)
    with svc.client("alice") as alice, svc.client("bob") as bob:
        first = threading.Thread(
            target=lambda: statuses.append(alice.post(url, json={"prompt": "1"}).status_code)
        )
        first.start()
        deadline = time.monotonic() + 10
        while conn.get(active_key("alice")) != b"1":  # counted, and waiting for its reply
            assert time.monotonic() < deadline
            time.sleep(0.02)
        second = alice.post(url, json={"prompt": "1"})
        assert second.status_code == 429, second.text
        assert "PDPPO_SAMPLE_MAX_CONCURRENT_PER_TENANT" in second.json()["detail"]
        assert bob.post(url, json={"prompt": "1"}).status_code == 404  # alice's job, not 429
        first.join()
        assert statuses == [504]
        assert alice.post(url, json={"prompt": "1"}).status_code == 504  # not 429: count freed
    conn.close()


def test_a_request_past_its_deadline_is_dropped_by_the_worker(
    unserved: tuple[Service, str],
) -> None:
    """Requests answered 504 while no sample worker ran are still queued; the worker that starts
    later drops each of them unanswered (their callers are gone) instead of generating, and no
    reply is left in Redis."""
    svc, job_id = unserved
    with svc.client("alice") as alice:
        assert alice.post(f"/v1/jobs/{job_id}/completions", json={"prompt": "1"}).status_code == 504
    conn = redis.Redis.from_url(svc.redis_url)
    queued = conn.llen("sample")
    assert queued >= 1
    worker = svc.start_sample_worker()
    log_name = f"sample-{svc.workers.index(worker)}.log"
    deadline = time.monotonic() + 30
    while svc.tail(log_name, 1_000_000).count("its deadline passed in the queue; dropped") < queued:
        assert time.monotonic() < deadline, svc.tail(log_name)
        time.sleep(0.1)
    assert conn.llen("sample") == 0
    assert conn.keys("pdppo:sample:reply:*") == []
    conn.close()


def test_the_compose_healthcheck_finds_its_own_sample_worker(
    unserved: tuple[Service, str],
) -> None:
    check_compose_healthcheck(unserved[0], "sample")
