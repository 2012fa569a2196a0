"""The client's plain requests against a scripted transport, each with its known answer: how an
error answer becomes `ApiError` (its status, detail and message), what `health`, `list`,
`iter_jobs`, `download` and the file methods send and return, how long a retried write waits,
and how a spec file is read. Found by the mutation run of the client (bench/mutation.toml,
group "client"): the live-stack tests reach these lines but do not pin their values."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest

from pdppo.client import ApiError, Client, Event, Job, detail_text
from pdppo.client.errors import raise_for_status
from pdppo.client.retry import _detail, _retry_after, send_with_retry
from pdppo.client.specs import SpecFileError, resolve_spec_paths, spec_to_dict
from tests.client.scripted import scripted

URL = "http://pdppo.test"


def client(transport: httpx.MockTransport, **kw: float) -> Client:
    return Client(URL + "/", "key", transport=transport, retry_seconds=0, **kw)  # type: ignore[arg-type]


def answer(status: int, **kw: object) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", URL + "/v1/x"), **kw)  # type: ignore[arg-type]


def test_validation_details_read_as_one_line_per_problem() -> None:
    detail = [
        {"loc": ["body", "train", "steps"], "msg": "must be > 0"},
        {"loc": ["body"], "msg": "bad body"},
        {"msg": "no loc"},
        "plain",
    ]
    assert detail_text(detail) == "train.steps: must be > 0; bad body; no loc; plain"
    assert detail_text("just text") == "just text"
    assert detail_text({"a": 1}) == "{'a': 1}"


def test_an_error_answer_becomes_an_api_error_with_its_detail() -> None:
    raise_for_status(answer(399, text="fine"))  # below 400: nothing raised
    with pytest.raises(ApiError) as plain:
        raise_for_status(answer(400, text="<html>oops</html>"))
    assert (plain.value.status_code, plain.value.detail) == (400, "<html>oops</html>")
    assert str(plain.value) == f"HTTP 400 (GET {URL}/v1/x): <html>oops</html>"

    with pytest.raises(ApiError) as errors_only:
        raise_for_status(answer(422, json={"errors": [{"loc": ["body", "f"], "msg": "bad"}]}))
    assert errors_only.value.detail == [{"loc": ["body", "f"], "msg": "bad"}]
    assert str(errors_only.value).endswith(": f: bad")

    with pytest.raises(ApiError) as neither:
        raise_for_status(answer(500, json={"status": "down"}))
    assert neither.value.detail == {"status": "down"}
    assert str(ApiError(404, "gone")) == "HTTP 404: gone"
    assert ApiError(404, "gone").may_exist == []


def test_health_is_true_only_for_a_200() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    for response, healthy in [(200, True), (503, False)]:
        transport, seen = scripted([lambda r, s=response: httpx.Response(s)])  # type: ignore[misc]
        with client(transport) as c:
            assert c.health() is healthy
        assert seen[0].url == URL + "/readyz"
    transport, _ = scripted([refused])
    with client(transport) as c:
        assert c.health() is False


def test_the_client_reads_its_url_and_key_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PDPPO_URL", URL + "/")
    monkeypatch.setenv("PDPPO_API_KEY", "env-key")
    transport, seen = scripted(
        [lambda r: httpx.Response(200, json={"id": "j", "status": "queued"})]
    )
    with Client(transport=transport) as c:
        assert c.base_url == URL
        c.get("j")
    assert seen[0].headers["Authorization"] == "Bearer env-key"
    monkeypatch.delenv("PDPPO_URL")
    with Client(api_key="", transport=transport) as c:
        assert c.base_url == "http://127.0.0.1:8000"
        c.get("j")
    assert "Authorization" not in seen[1].headers


def test_list_sends_only_the_filters_given_and_iter_jobs_walks_the_pages() -> None:
    pages = [
        {"items": [{"id": "a", "status": "queued"}], "next_cursor": "c1"},
        {"items": [{"id": "b", "status": "queued"}], "next_cursor": "c2"},
        {"items": [], "next_cursor": "c3"},  # an empty page ends the walk, whatever its cursor
    ]
    transport, seen = scripted([lambda r, p=p: httpx.Response(200, json=p) for p in pages])  # type: ignore[misc]
    with client(transport) as c:
        assert [j.id for j in c.iter_jobs(status="queued", page_size=1)] == ["a", "b"]
    assert [dict(r.url.params) for r in seen] == [
        {"limit": "1", "status": "queued"},
        {"limit": "1", "status": "queued", "cursor": "c1"},
        {"limit": "1", "status": "queued", "cursor": "c2"},
    ]
    file_pages = [
        {"items": [{"id": "file-a"}], "next_cursor": "f1"},
        {"items": [{"id": "file-b"}], "next_cursor": None},  # no cursor ends it too
    ]
    transport, seen = scripted([lambda r, p=p: httpx.Response(200, json=p) for p in file_pages])  # type: ignore[misc]
    with client(transport) as c:
        assert [f.id for f in c.iter_files(page_size=1)] == ["file-a", "file-b"]
    assert [dict(r.url.params) for r in seen] == [{"limit": "1"}, {"limit": "1", "cursor": "f1"}]
    last = [{"items": [{"id": "a", "status": "queued"}], "next_cursor": None}]
    transport, seen = scripted([lambda r: httpx.Response(200, json=last[0])])
    with client(transport) as c:
        assert [j.id for j in c.iter_jobs()] == ["a"]
    assert dict(seen[0].url.params) == {"limit": "50"}


def checkpoints_server(files: dict[str, bytes]) -> httpx.MockTransport:
    listing = {
        "items": [
            {"name": "step-000002", "step": 2, "download_url": "/dl/step-000002"},
            {"name": "step-000004", "step": 4, "download_url": "/dl/step-000004"},
        ],
        "final_model_url": "/dl/final" if "final" in files else None,
    }

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/checkpoints"):
            return httpx.Response(200, json=listing)
        name = request.url.path.rsplit("/", 1)[1]
        if name in files:
            return httpx.Response(200, content=files[name])
        return httpx.Response(410, json={"detail": "rotated away"})

    return httpx.MockTransport(handler)


def test_download_names_the_file_and_refuses_what_the_job_has_not(tmp_path: Path) -> None:
    with client(checkpoints_server({"step-000002": b"tar2", "final": b"tarF"})) as c:
        saved = c.download("j1", "step-000002", tmp_path)
        assert saved == tmp_path / "j1-step-000002.tar" and saved.read_bytes() == b"tar2"
        named = c.download("j1", "final", tmp_path / "sub" / "model.tar")
        assert named.read_bytes() == b"tarF"
        with pytest.raises(ApiError) as gone:
            c.download("j1", "step-000004", tmp_path)
        assert (gone.value.status_code, gone.value.detail) == (410, "rotated away")
        with pytest.raises(ApiError) as unknown:
            c.download("j1", "step-000009", tmp_path)
        assert (unknown.value.status_code, unknown.value.detail) == (
            404,
            "job j1 has no checkpoint 'step-000009' (has: step-000002, step-000004)",
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j1-step-000002.tar", "sub"]
    with client(checkpoints_server({})) as c:
        with pytest.raises(ApiError) as no_final:
            c.download("j1", "final", tmp_path)
        assert no_final.value.detail == "job j1 has no final model (yet)"


def test_events_and_jobs() -> None:
    assert Event("status", '{"status": "running"}', "1-0").json() == {"status": "running"}
    assert Event("message", "").json() is None
    assert [Job(id="j", status=s).done for s in ("queued", "succeeded", "failed", "cancelled")] == [
        False,
        True,
        True,
        True,
    ]


def test_the_file_methods(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_bytes(b'{"prompt": "1"}\n')
    record = {"id": "file-1", "filename": "d.jsonl", "bytes": 16}
    transport, seen = scripted(
        [
            lambda r: httpx.Response(201, json=record),
            lambda r: httpx.Response(200, json=record),
            lambda r: httpx.Response(200, json={"items": [record], "next_cursor": None}),
            lambda r: httpx.Response(200, content=b"body"),
            lambda r: httpx.Response(204),
        ]
    )
    with client(transport) as c:
        assert c.upload_file(data, purpose="train").created is True
        assert c.upload_file(str(data)).created is False
        assert [f.id for f in c.list_files(limit=5, cursor="k").items] == ["file-1"]
        assert c.download_file("file-1", tmp_path).read_bytes() == b"body"
        c.delete_file("file-1")
    assert b'name="purpose"\r\n\r\ntrain' in seen[0].content
    assert b'filename="d.jsonl"' in seen[0].content and b'name="purpose"' not in seen[1].content
    assert dict(seen[2].url.params) == {"limit": "5", "cursor": "k"}
    assert seen[3].url.path == "/v1/files/file-1/content"
    assert (tmp_path / "file-1.jsonl").read_bytes() == b"body"
    assert (seen[4].method, seen[4].url.path) == ("DELETE", "/v1/files/file-1")


def test_retry_after_and_the_waits_between_tries(caplog: pytest.LogCaptureFixture) -> None:
    assert _retry_after(answer(503, headers={"Retry-After": "2.5"}), 1.0) == 2.5
    assert _retry_after(answer(503, headers={"Retry-After": "-3"}), 1.0) == 0.0
    assert _retry_after(answer(503, headers={"Retry-After": "soon"}), 1.0) == 1.0
    assert _detail(answer(503, text="x" * 300)) == "x" * 200
    assert _detail(answer(503, json=["a"])) == '["a"]'  # JSON, but not an object

    slept: list[float] = []
    tries = iter(
        [
            answer(503, headers={"Retry-After": "2"}),
            answer(503),
            answer(503, headers={"Retry-After": "9"}),
            answer(200),
        ]
    )
    with caplog.at_level(logging.WARNING, logger="pdppo.client"):
        sent = send_with_retry(
            lambda: next(tries), budget=60, max_delay=5, what="POST /v1/x", sleep=slept.append
        )
    assert sent.response.status_code == 200 and (sent.named, sent.ambiguous) == ([], False)
    assert [round(s) for s in slept] == [2, 1, 5]  # Retry-After, the default 1 s, the cap
    assert caplog.messages == ["POST /v1/x: HTTP 503: ; retrying for up to 60s"]

    def drop() -> httpx.Response:
        raise httpx.ReadError("reset")

    drops = iter([drop, drop, drop, lambda: answer(201)])
    slept.clear()
    sent = send_with_retry(lambda: next(drops)(), budget=60, max_delay=0.6, sleep=slept.append)
    assert sent.ambiguous is True and sent.response.status_code == 201
    assert [round(s, 2) for s in slept] == [0.25, 0.5, 0.6]  # doubling from 0.25 s, capped


def test_a_503_past_the_budget_is_returned_with_what_it_named() -> None:
    named = answer(
        503,
        headers={"Pdppo-Job-Id": "j1", "Pdppo-File-Id": "file-1", "Pdppo-Experiment-Id": "e1"},
    )
    sent = send_with_retry(lambda: named, budget=0, max_delay=1, sleep=lambda s: None)
    assert (sent.response.status_code, sent.named, sent.ambiguous) == (
        503,
        ["j1", "file-1", "e1"],
        True,
    )


def test_a_spec_file_is_read_with_its_paths_made_absolute(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "train:\n  optim: {lr: 1e-5}\n  task: {path: data/t.jsonl, validation_path: '', file: f}\n"
        "  model: {name: 'hf:model'}\n"
    )
    loaded = spec_to_dict(spec)
    assert loaded["train"]["optim"]["lr"] == 1e-5
    assert loaded["train"]["task"] == {
        "path": str(tmp_path / "data" / "t.jsonl"),
        "validation_path": "",
        "file": "f",
    }
    assert loaded["train"]["model"] == {"name": f"hf:{tmp_path / 'model'}"}
    hub = resolve_spec_paths({"train": {"model": {"name": "hf:org/name"}}}, tmp_path)
    assert hub == {"train": {"model": {"name": "hf:org/name"}}}
    home = resolve_spec_paths({"train": {"task": {"path": "/abs/t.jsonl"}}}, tmp_path)
    assert home["train"]["task"]["path"] == "/abs/t.jsonl"
    assert resolve_spec_paths({"train": 3}, tmp_path) == {"train": 3}

    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(SpecFileError) as broken:
        spec_to_dict(bad)
    assert str(broken.value).startswith(f"{bad}: not valid YAML/JSON: line 2, column 1: ")
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    with pytest.raises(SpecFileError) as not_a_mapping:
        spec_to_dict(listed)
    assert str(not_a_mapping.value) == f"{listed}: a job spec must be a mapping, got list"
    assert json.loads(json.dumps(spec_to_dict({"a": 1}))) == {"a": 1}
