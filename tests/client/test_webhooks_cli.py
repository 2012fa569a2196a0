"""The client's webhook methods and `pdppo webhooks ...` against the real stack (redis-server,
`pdppo serve`, `pdppo webhook-worker`) delivering to a local receiver, and the CLI's tables.

The service allows 127.0.0.0/8 (PDPPO_WEBHOOK_ALLOWED_NETWORKS; loopback is refused by default)
and retries after 1 s, so that the receiver's 500-then-200 plays out in seconds. No training
worker runs: `test` makes a delivery without a job.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from standardwebhooks import Webhook as Verifier

from pdppo.cli import main
from pdppo.client import ApiError, Client
from pdppo.client.webhooks import Webhook, WebhookDelivery
from pdppo.commands.webhooks import (
    SECRET_HINT,
    created_lines,
    delivery_lines,
    webhook_line,
)
from tests.support.stack import KEYS, REPO, RedisServer, Service, check_compose_healthcheck
from tests.support.webhook_receiver import Received, Receiver

ENV = {
    "PDPPO_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
    "PDPPO_WEBHOOK_RETRY_SCHEDULE": "1,1",
    "PDPPO_WEBHOOK_TIMEOUT_SECONDS": "2",
    "PDPPO_WEBHOOK_RESEND_SECONDS": "4",
}
DEFAULT_EVENTS = ["job.succeeded", "job.failed", "job.cancelled"]


@pytest.fixture(scope="module")
def hooks(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The API and a webhook worker on a database of their own (as `make_service` picks one)."""
    db = 1 + len(list(tmp_path_factory.getbasetemp().glob("extra*")))
    svc = Service(redis_server, tmp_path_factory.mktemp("extra"), db=db, env=ENV)
    try:
        svc.start_api()
        svc.start_webhook_worker()
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    made = Receiver(failures=1)
    made.start()
    yield made
    made.stop()


def env_of(svc: Service, tenant: str) -> dict[str, str]:
    return {"PDPPO_URL": svc.base_url, "PDPPO_API_KEY": KEYS[tenant]}


def run(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args, env=env)
    return result.exit_code, result.stdout, result.stderr


def arrivals(
    receiver: Receiver, path: str, done: Callable[[list[Received]], bool]
) -> list[Received]:
    deadline = time.monotonic() + 30
    while not done(got := receiver.at(path)):
        assert time.monotonic() < deadline, f"{path} received only {[r.body for r in got]}"
        time.sleep(0.05)
    return got


def settled(client: Client, hook: str, message: str) -> WebhookDelivery:
    """The delivery once it is no longer pending (the receiver's answer is recorded after it
    arrives there)."""
    deadline = time.monotonic() + 30
    while (found := client.get_webhook_delivery(hook, message)).status == "pending":
        assert time.monotonic() < deadline, found
        time.sleep(0.05)
    return found


def test_client_webhook_methods(hooks: Service, receiver: Receiver) -> None:
    path = "/flaky?t=client"
    with Client(hooks.base_url, KEYS["alice"]) as client:
        made = client.create_webhook(f"{receiver.url}{path}", ["job.failed"], "mine")
        assert made.secret is not None and made.secret.startswith("whsec_")
        assert (made.url, made.events, made.description) == (
            f"{receiver.url}{path}",
            ["job.failed"],
            "mine",
        )
        assert [(h.id, h.secret) for h in client.list_webhooks()] == [(made.id, None)]
        assert client.get_webhook(made.id).model_dump(exclude={"secret"}) == made.model_dump(
            exclude={"secret"}
        )
        assert client.create_webhook(f"{receiver.url}/ok?t=default").events == DEFAULT_EVENTS

        sent = client.test_webhook(made.id)
        assert (sent.webhook_id, sent.type, sent.status, sent.attempts) == (
            made.id,
            "webhook.test",
            "pending",
            0,
        )
        got = arrivals(receiver, path, lambda got: len(got) >= 2)  # 500, then 200 a second on
        done = settled(client, made.id, sent.id)
        assert [r.status for r in got] == [500, 200]
        assert {r.headers["webhook-id"] for r in got} == {sent.id}
        body = Verifier(made.secret).verify(got[1].body, got[1].headers)
        assert body["type"] == "webhook.test" and done.payload == body
        assert (done.status, done.attempts, done.last_status_code, done.last_error) == (
            "delivered",
            2,
            200,
            None,
        )
        assert [a.status_code for a in done.history] == [500, 200]

        again = client.redeliver(made.id, sent.id)
        assert (again.id, again.status) == (sent.id, "pending")
        third = arrivals(receiver, path, lambda got: len(got) >= 3)[2]
        assert (third.headers["webhook-id"], third.status) == (sent.id, 200)

        second = client.test_webhook(made.id)
        settled(client, made.id, second.id)
        page = client.webhook_deliveries(made.id, limit=1)
        assert [d.id for d in page.items] == [second.id] and page.next_cursor is not None
        older = client.webhook_deliveries(made.id, limit=1, cursor=page.next_cursor)
        assert [d.id for d in older.items] == [sent.id]
        walked = [d.id for d in client.iter_webhook_deliveries(made.id, page_size=1)]
        assert walked == [second.id, sent.id]

        client.delete_webhook(made.id)
        with pytest.raises(ApiError) as gone:
            client.get_webhook(made.id)
        assert gone.value.status_code == 404
        with pytest.raises(ApiError) as refused:
            client.create_webhook("http://10.1.2.3/hook")
        assert refused.value.status_code == 400
        assert "resolves to 10.1.2.3, which is not a public address" in str(refused.value)
        for hook in client.list_webhooks():
            client.delete_webhook(hook.id)


def test_two_tenants_registering_one_url_each_see_their_own(
    hooks: Service, receiver: Receiver
) -> None:
    url = f"{receiver.url}/ok?t=shared"
    with Client(hooks.base_url, KEYS["alice"]) as alice, Client(hooks.base_url, KEYS["bob"]) as bob:
        hers = alice.create_webhook(url)
        his = bob.create_webhook(url)
        assert hers.id != his.id and hers.secret != his.secret
        assert [h.id for h in alice.list_webhooks()] == [hers.id]
        assert [h.id for h in bob.list_webhooks()] == [his.id]
        with pytest.raises(ApiError) as hidden:
            alice.get_webhook(his.id)
        assert hidden.value.status_code == 404
        sent = bob.test_webhook(his.id)
        with pytest.raises(ApiError) as not_hers:
            alice.redeliver(his.id, sent.id)
        assert not_hers.value.status_code == 404

        code, out, _ = run(["webhooks", "list"], env_of(hooks, "bob"))
        assert (code, [line.split()[0] for line in out.splitlines()]) == (0, [his.id])
        code, out, err = run(["webhooks", "delete", his.id], env_of(hooks, "alice"))
        assert code == 2 and out == ""
        assert err.startswith(f"Error: webhook '{his.id}' not found (HTTP 404 from DELETE "), err
        assert [h.id for h in bob.list_webhooks()] == [his.id]  # still there
        alice.delete_webhook(hers.id)
        bob.delete_webhook(his.id)


def test_webhooks_commands(hooks: Service, receiver: Receiver) -> None:
    env = env_of(hooks, "carol")
    url = f"{receiver.url}/ok?t=cli"
    args = ["webhooks", "create", url, "--event", "job.succeeded", "--event", "job.checkpoint"]
    code, out, err = run([*args, "--description", "from the cli"], env)
    assert code == 0, err
    lines = out.splitlines()
    hook = lines[0].removeprefix("id      ")
    secret = lines[3].removeprefix("secret  ")
    assert lines == [
        f"id      {hook}",
        f"url     {url}",
        "events  job.succeeded, job.checkpoint",
        f"secret  {secret}",
    ]
    assert secret.startswith("whsec_") and err == SECRET_HINT + "\n"

    code, out, _ = run(["webhooks", "list"], env)
    assert out == f"{hook}  {url}  job.succeeded,job.checkpoint  from the cli\n"
    code, out, _ = run(["webhooks", "list", "--json"], env)
    assert [json.loads(line)["id"] for line in out.splitlines()] == [hook]
    code, out, _ = run(["webhooks", "show", hook], env)
    shown = json.loads(out)
    assert (shown["id"], shown["description"], "secret" in shown) == (hook, "from the cli", False)

    code, out, _ = run(["webhooks", "test", hook], env)
    message = out.split()[0]
    assert (code, out) == (
        0,
        f"{message} webhook.test pending: sent now (pdppo webhooks deliveries {hook})\n",
    )
    got = arrivals(receiver, "/ok?t=cli", lambda got: len(got) >= 1)
    assert Verifier(secret).verify(got[0].body, got[0].headers)["type"] == "webhook.test"
    with Client(hooks.base_url, KEYS["carol"]) as client:
        settled(client, hook, message)
    code, out, _ = run(["webhooks", "deliveries", hook], env)
    header, row = out.splitlines()
    assert header.split() == ["ID", "TYPE", "STATUS", "ATTEMPTS", "LAST", "NEXT", "ATTEMPT"]
    assert row.split() == [message, "webhook.test", "delivered", "1", "HTTP", "200", "-"]
    code, out, _ = run(["webhooks", "deliveries", hook, "--json", "--limit", "1"], env)
    assert [json.loads(line)["status"] for line in out.splitlines()] == ["delivered"]

    code, out, _ = run(["webhooks", "redeliver", hook, message], env)
    assert (code, out) == (
        0,
        f"{message} pending: sent again now (pdppo webhooks deliveries {hook})\n",
    )
    arrivals(receiver, "/ok?t=cli", lambda got: len(got) >= 2)

    code, out, err = run(["webhooks", "create", url, "--event", "job.finished"], env)
    assert code == 2 and out == "" and "HTTP 422" in err and "events.0" in err, err
    code, out, err = run(["webhooks", "create", "http://10.1.2.3/hook"], env)
    assert code == 2 and out == "", out
    assert "resolves to 10.1.2.3, which is not a public address" in err and "HTTP 400" in err

    code, out, _ = run(["webhooks", "delete", hook], env)
    assert (code, out) == (0, f"{hook} deleted\n")
    code, out, err = run(["webhooks", "list"], env)
    assert (code, out, err) == (0, "", "no webhooks (pdppo webhooks create URL registers one)\n")


def test_the_compose_healthcheck_finds_its_own_webhook_worker(hooks: Service) -> None:
    check_compose_healthcheck(hooks, "webhooks")


def test_created_and_listed_endpoint_lines() -> None:
    at = datetime(2026, 12, 5, hour=3, minute=4, second=5, tzinfo=UTC)
    hook = Webhook(
        id="wh_1",
        url="https://e.com/h",
        events=["job.failed", "job.succeeded"],
        description="",
        created_at=at,
        secret="whsec_abc",
    )
    assert created_lines(hook) == [
        "id      wh_1",
        "url     https://e.com/h",
        "events  job.failed, job.succeeded",
        "secret  whsec_abc",
    ]
    assert webhook_line(hook) == "wh_1  https://e.com/h  job.failed,job.succeeded"
    described = hook.model_copy(update={"description": "ops"})
    assert webhook_line(described) == "wh_1  https://e.com/h  job.failed,job.succeeded  ops"


def delivery(**fields: Any) -> WebhookDelivery:
    base = {"id": "msg_1", "webhook_id": "wh_1", "type": "job.failed", "status": "delivered"}
    return WebhookDelivery.model_validate(base | fields)


def test_the_deliveries_table() -> None:
    due = datetime(2026, 12, 5, hour=3, minute=4, second=5, tzinfo=UTC)
    rows = delivery_lines(
        [
            delivery(attempts=1, last_status_code=204),
            delivery(
                id="msg_2",
                type="fine_tuning.job.cancelled",
                status="pending",
                attempts=3,
                last_status_code=500,
                last_error="HTTP 500:\n" + "x" * 60,
                next_attempt_at=due,
            ),
            delivery(id="msg_3", status="failed", attempts=8, next_attempt_at=due),
            delivery(id="msg_4", status="pending", last_error="e" * 40),
        ]
    )
    assert rows == [
        "ID"
        + " " * 36
        + "TYPE"
        + " " * 23
        + "STATUS     ATTEMPTS  LAST"
        + " " * 38
        + "NEXT ATTEMPT",
        "msg_1"
        + " " * 33
        + "job.failed"
        + " " * 17
        + "delivered  1         HTTP 204"
        + " " * 34
        + "-",
        "msg_2"
        + " " * 33
        + "fine_tuning.job.cancelled  pending    3         HTTP 500: "
        + "x" * 29
        + "…  2026-12-05 03:04:05",
        "msg_3" + " " * 33 + "job.failed" + " " * 17 + "failed     8         -" + " " * 41 + "-",
        "msg_4" + " " * 33 + "job.failed" + " " * 17 + "pending    0         " + "e" * 40 + "  -",
    ]


def test_the_docs_receiver_verifies_and_handles_each_event_once(tmp_path: Path) -> None:
    """docs/users/webhooks.md's receiver, run as written (on a free port): a signed delivery is
    handled and answered 204, its retry (same webhook-id) answered but not handled again, and
    a changed body refused with 400."""
    import re
    import socket

    import httpx

    from pdppo.webhooks import new_secret, sign

    page = (REPO / "docs" / "users" / "webhooks.md").read_text()
    code = re.findall(r"```python\n(.*?)```", page, re.DOTALL)[0]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert '("0.0.0.0", 8080)' in code
    script = tmp_path / "receiver.py"
    script.write_text(code.replace('("0.0.0.0", 8080)', f'("127.0.0.1", {port})'))
    secret = new_secret()
    proc = subprocess.Popen(
        [sys.executable, "-u", str(script)],
        env={"PATH": "", "WEBHOOK_SECRET": secret, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        body = b'{"type":"job.succeeded","timestamp":"t","data":{"id":"j1"}}'
        now = int(time.time())
        headers = {
            "webhook-id": "msg_1",
            "webhook-timestamp": str(now),
            "webhook-signature": sign(secret, "msg_1", now, body),
        }
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 30
        while True:
            try:
                first = httpx.post(url, content=body, headers=headers).status_code
                break
            except httpx.ConnectError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        again = httpx.post(url, content=body, headers=headers).status_code
        changed = httpx.post(url, content=body + b" ", headers=headers).status_code
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert (first, again, changed) == (204, 204, 400)
    assert out == "job.succeeded {'id': 'j1'}\n"


def test_the_client_asks_for_the_servers_page_sizes_and_walks_the_cursor() -> None:
    """What the webhook calls send when given only an id (a recording transport stands in for
    the server): a page of 20 as the API's own default, pages of 100 (its most) when walking,
    and no `events` unless some are named, so the server's defaults apply."""
    import httpx

    sent: list[tuple[str, str, dict[str, str], bytes]] = []
    pages = {"": {"items": [], "next_cursor": "17"}, "17": {"items": [], "next_cursor": None}}
    one = {"id": "msg_1", "webhook_id": "wh_1", "type": "webhook.test", "status": "pending"}

    def answer(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        sent.append((request.method, request.url.path, params, request.content))
        if request.url.path.endswith("/deliveries"):
            page = pages[params.get("cursor", "")]
            return httpx.Response(200, json={**page, "items": [one] if page["next_cursor"] else []})
        return httpx.Response(201, json={"id": "wh_1", "url": "https://e.com/h", "secret": "s"})

    with Client("http://pdppo.test", "k", transport=httpx.MockTransport(answer)) as client:
        client.webhook_deliveries("wh_1")
        assert [d.id for d in client.iter_webhook_deliveries("wh_1")] == ["msg_1"]
        client.create_webhook("https://e.com/h")
        client.create_webhook("https://e.com/h", ["job.failed"], "d")
    path = "/v1/webhooks/wh_1/deliveries"
    assert [(m, p, q) for m, p, q, _ in sent] == [
        ("GET", path, {"limit": "20"}),
        ("GET", path, {"limit": "100"}),
        ("GET", path, {"limit": "100", "cursor": "17"}),
        ("POST", "/v1/webhooks", {}),
        ("POST", "/v1/webhooks", {}),
    ]
    assert json.loads(sent[3][3]) == {"url": "https://e.com/h", "description": ""}
    assert json.loads(sent[4][3]) == {
        "url": "https://e.com/h",
        "description": "d",
        "events": ["job.failed"],
    }
