"""`client.files.*` of the official `openai` SDK against `/v1/files`, in-process (the SDK over an
ASGI transport to the real app, a real redis-server; the setup of test_openai_routes, kept apart
so that each module stays about one resource): listing with OpenAI's `after`/`limit`/`order`/
`purpose` and the SDK's auto-pagination, delete's object, content, and errors in both shapes
(OpenAI's `error` for the SDK beside the `detail` pdppo's own clients read)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from starlette.requests import Request

from api.openai.errors import error_body, unexpected
from pdppo.settings import Settings
from tests.support.inprocess import KEYS
from tests.support.openai_inprocess import METHOD, SMALL, run


def rows(tag: str, n: int = 2) -> bytes:
    """Valid RFT rows; a different `tag` is different content, so a different file."""
    return b"".join(
        json.dumps({"messages": [{"role": "user", "content": f"{tag}{i}="}]}).encode() + b"\n"
        for i in range(n)
    )


async def upload(sdk: AsyncOpenAI, content: bytes, purpose: str = "fine-tune") -> str:
    made = await sdk.files.create(file=("d.jsonl", content), purpose=purpose)  # type: ignore[arg-type]
    return made.id


def test_the_sdk_pages_through_files_with_after_and_limit(settings: Settings) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        made = [await upload(sdk, rows(f"p{i}-")) for i in range(5)]
        newest = made[::-1]
        first = await sdk.files.list(limit=2)
        assert ([f.id for f in first.data], first.has_more) == (newest[:2], True)
        extra = first.model_extra or {}
        assert (extra["object"], extra["first_id"], extra["last_id"]) == ("list", *newest[:2])
        # the SDK's auto-pagination: the last id of each page as `after`, until has_more is false
        assert [f.id async for f in sdk.files.list(limit=2)] == newest
        last = await sdk.files.list(limit=2, after=newest[3])
        assert ([f.id for f in last.data], last.has_more) == (newest[4:], False)
        end = await sdk.files.list(after=newest[4])
        assert (end.data, end.has_more) == ([], False)
        assert (end.model_extra or {})["first_id"] is None
        assert [f.id async for f in sdk.files.list(limit=2, order="asc")] == made
        asc = await sdk.files.list(limit=3, order="asc", after=made[1])
        assert [f.id for f in asc.data] == made[2:]
        native_cursor = (await sdk.files.list(limit=1)).model_extra
        assert native_cursor is not None and native_cursor["next_cursor"].endswith(newest[0])
        with pytest.raises(openai.BadRequestError) as both:  # two cursors: which one is meant?
            await sdk.files.list(
                after=newest[0], extra_query={"cursor": native_cursor["next_cursor"]}
            )
        assert both.value.message == "Error code: 400 - give `after` or `cursor`, not both"
        # no `limit`: pdppo's page of 20, all five
        assert [f.id for f in (await sdk.files.list()).data] == newest

    run(settings, work)


def test_purpose_keeps_only_the_files_uploaded_with_it_across_pages(
    settings: Settings,
) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        kinds = ["fine-tune", "batch", "fine-tune", "batch", "batch", "fine-tune", "fine-tune"]
        made = [await upload(sdk, rows(f"k{i}-"), kind) for i, kind in enumerate(kinds)]
        tuning = [m for m, k in zip(made, kinds, strict=True) if k == "fine-tune"][::-1]
        page = await sdk.files.list(purpose="fine-tune", limit=2)
        assert ([f.id for f in page.data], page.has_more) == (tuning[:2], True)
        assert [f.id async for f in sdk.files.list(purpose="fine-tune", limit=1)] == tuning
        batch = [f.id async for f in sdk.files.list(purpose="batch", limit=2, order="asc")]
        assert batch == [made[1], made[3], made[4]]
        assert [f.id async for f in sdk.files.list(purpose="vision")] == []

    run(settings, work)


def test_delete_answers_openais_object_and_the_file_is_gone(settings: Settings) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        kept, gone = await upload(sdk, rows("kept")), await upload(sdk, rows("gone"))
        deleted = await sdk.files.delete(gone)
        assert (deleted.id, deleted.object, deleted.deleted) == (gone, "file", True)
        with pytest.raises(openai.NotFoundError) as missing:
            await sdk.files.retrieve(gone)
        assert (missing.value.code, missing.value.type) == ("not_found", "invalid_request_error")
        assert missing.value.body == {
            "message": f"file {gone!r} not found",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
        with pytest.raises(openai.NotFoundError):
            await sdk.files.delete(gone)
        assert [f.id async for f in sdk.files.list()] == [kept]
        with pytest.raises(openai.BadRequestError) as stale:  # its place in the listing is gone
            await sdk.files.list(after=gone)
        assert f"after: file {gone!r} is not among your files" in stale.value.message

    run(settings, work)


def test_content_retrieve_content_and_wait_for_processing(settings: Settings) -> None:
    content = rows("c", 3)

    async def work(sdk: AsyncOpenAI) -> None:
        file_id = await upload(sdk, content)
        assert await (await sdk.files.content(file_id)).aread() == content
        with pytest.warns(DeprecationWarning):  # the SDK's own, pointing at content()
            assert await sdk.files.retrieve_content(file_id) == content.decode()
        done = await sdk.files.wait_for_processing(file_id, poll_interval=0.01)
        assert (done.id, done.status, done.bytes) == (file_id, "processed", len(content))

    run(settings, work)


def test_what_pdppo_cannot_do_is_a_refusal_in_openais_shape(settings: Settings) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        with pytest.raises(openai.UnprocessableEntityError) as expiring:
            await sdk.files.create(
                file=("d.jsonl", rows("e")),
                purpose="fine-tune",
                expires_after={"anchor": "created_at", "seconds": 3600},
            )
        assert expiring.value.param == "expires_after"
        assert "pdppo keeps a file until it is deleted" in str(expiring.value.body)
        assert expiring.value.response.headers["x-should-retry"] == "false"
        assert [f async for f in sdk.files.list()] == []  # nothing stored
        with pytest.raises(openai.UnprocessableEntityError) as big:
            await sdk.files.list(limit=101)
        assert big.value.param == "limit" and big.value.code is None
        native = big.value.response.json()
        assert native["detail"].startswith("query.limit: ") and native["errors"][0]["loc"] == [
            "query",
            "limit",
        ]

    run(settings, work)


def test_a_file_a_queued_job_names_is_a_conflict_the_sdk_does_not_retry(
    settings: Settings,
) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        file_id = await upload(sdk, rows("busy", 8))
        job = await sdk.fine_tuning.jobs.create(
            model="builtin:tiny",
            training_file=file_id,
            method=METHOD,  # type: ignore[arg-type]
            extra_body={"pdppo": SMALL},
        )
        with pytest.raises(openai.ConflictError) as busy:
            await sdk.files.delete(file_id)
        assert busy.value.response.headers["x-should-retry"] == "false"
        assert busy.value.code == "conflict"
        assert job.id.removeprefix("ftjob-") in busy.value.response.json()["detail"]

    run(settings, work)


def test_two_tenants_with_the_same_bytes_each_list_and_delete_only_their_own(
    settings: Settings,
) -> None:
    shared, own = rows("same"), rows("alice only")

    async def alice(sdk: AsyncOpenAI) -> list[str]:
        return [await upload(sdk, shared), await upload(sdk, own)]

    async def bob(sdk: AsyncOpenAI) -> Any:
        mine = await upload(sdk, shared)
        listed = [f.id async for f in sdk.files.list()]
        with pytest.raises(openai.NotFoundError):
            await sdk.files.retrieve(alices[1])
        with pytest.raises(openai.NotFoundError):
            await sdk.files.delete(alices[1])
        with pytest.raises(openai.BadRequestError):  # alice's file is no place in bob's list
            await sdk.files.list(after=alices[1])
        return mine, listed, await sdk.files.delete(mine)

    async def alice_after(sdk: AsyncOpenAI) -> list[str]:
        assert (await sdk.files.content(alices[0])).content == shared
        return [f.id async for f in sdk.files.list()]

    alices = run(settings, alice)
    mine, listed, deleted = run(settings, bob, KEYS["bob"])
    assert mine == alices[0]  # the id derives from the content: the same for both tenants
    assert listed == [mine] and deleted.deleted
    assert run(settings, alice_after) == alices[::-1]  # bob's delete left alice's file


def test_the_file_quota_is_insufficient_quota_and_not_retried(settings: Settings) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        await upload(sdk, rows("one"))
        with pytest.raises(openai.RateLimitError) as full:
            await upload(sdk, rows("two"))
        assert (full.value.code, full.value.type) == ("insufficient_quota", "insufficient_quota")
        assert full.value.response.headers["x-should-retry"] == "false"
        assert full.value.response.json()["detail"] == (
            "tenant 'alice' has 1 files; the limit is 1 (PDPPO_MAX_FILES_PER_TENANT): "
            "delete some first"
        )

    run(settings.model_copy(update={"max_files_per_tenant": 1}), work)


def test_an_unexpected_error_on_files_is_both_shapes_and_elsewhere_native() -> None:
    def request(path: str) -> Request:
        return Request({"type": "http", "method": "GET", "path": path, "headers": []})

    files = unexpected(request("/v1/files/file-x"))
    assert files is not None and files.status_code == 500
    said = "internal error"
    assert json.loads(files.body) == {"detail": said, **error_body(500, said)}
    assert unexpected(request("/v1/filesystem")) is None and unexpected(request("/v1/jobs")) is None
