"""Files: upload a JSONL dataset, list, get, read back and delete it; a job spec names it by id.
The `openai` SDK's `client.files.*` calls work here too (`list_files` answers both clients'
page shapes, `delete_file` OpenAI's deletion object; errors carry OpenAI's `error` object
beside `detail`, see `api.openai.errors`).

An upload is streamed to disk (`api.storage.uploads`), checked line by line against the dataset
record schema (`core.tasks.records`, the rules the worker loads it with), and stored once per tenant
and content (`pdppo.files`: `<artifact_dir>/files/<tenant>/<sha256>.jsonl`): the id is
`file-<first 32 hex of its sha256>`, so uploading the same bytes again answers 200 with the file
already there (201 is a new file). A file with a bad line is refused whole (422, the first bad
lines by number), as is one past PDPPO_MAX_FILE_BYTES (413); nothing of a refused upload stays
on disk. Quotas per tenant: PDPPO_MAX_FILES_PER_TENANT files (429) and
PDPPO_MAX_FILE_BYTES_PER_TENANT bytes (413).

Deleting a file is refused (409, naming them) while queued, running or paused jobs name it
(`pdppo.store.deletion`); ended jobs keep their own link to it, taken when they started (see
`pdppo.files`). A job queued in the instant of a delete can still miss its file: it fails when it
starts, with `invalid_input`. PDPPO_MAX_STORAGE_BYTES_PER_TENANT (uploads and job artifacts
together, `api.routes.storage`) refuses uploads with 507.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any, BinaryIO, Literal

import anyio
from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from api.deps import FileDep, FileStoreDep, SettingsDep, TenantDep
from api.jobs.pending_writes import documented_503, pending_write
from api.routes.storage import forget_usage, refuse_over_quota
from api.schemas import ErrorBody, FileDeleted, FileList, FileObject
from api.storage.disk import refuse_without_room
from api.storage.uploads import UPLOAD_SCHEMA, Upload, UploadRefused, drain, receive_upload
from pdppo.files import FileStorage, Inspection, describe_problems, file_id_of, inspect_jsonl
from pdppo.settings import Settings
from pdppo.store import FileRecord, now_iso
from pdppo.store.deletion import AsyncDeletion
from pdppo.store.files import (
    CURSOR_PATTERN,
    FILE_ID_PATTERN,
    AsyncFileStore,
    FileBusy,
    listing_member,
)

router = APIRouter(prefix="/v1/files", tags=["files"])
CONTENT_TYPE = "application/x-ndjson"
READ_CHUNK = 1 << 16
FORM_FRAMING_BYTES = 1024
"""More than the framing of a usual upload form (~200 bytes), so the early check is lenient."""


def to_file(record: FileRecord) -> FileObject:
    return FileObject(
        id=record.id,
        filename=record.filename,
        bytes=record.bytes,
        records=record.records,
        sha256=record.sha256,
        created_at=datetime.fromisoformat(record.created_at),
        purpose=record.purpose,
    )


def _busy(exc: FileBusy) -> HTTPException:
    return HTTPException(503, detail=f"{exc}; try again shortly", headers={"Retry-After": "1"})


_UPLOAD_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "model": FileObject,
        "description": "this tenant already has this content: the same file (nothing stored)",
    },
    201: {"description": "a new file, stored"},
    400: {"model": ErrorBody, "description": "the body is not multipart/form-data, or malformed"},
    401: {"model": ErrorBody, "description": "missing or invalid API key"},
    413: {
        "model": ErrorBody,
        "description": (
            "the file is larger than PDPPO_MAX_FILE_BYTES, or would take the tenant's files "
            "past PDPPO_MAX_FILE_BYTES_PER_TENANT"
        ),
    },
    422: {
        "model": ErrorBody,
        "description": (
            "a line that is not a valid record (`errors`: the first bad lines, each with "
            '`loc` ["body", "file", "line", N]), an empty file, or a bad form field'
        ),
    },
    429: {"model": ErrorBody, "description": "the tenant has PDPPO_MAX_FILES_PER_TENANT files"},
    **documented_503(
        "file",
        "the file may have been stored (an upload of the same content answers it, never a "
        "second file)",
        also="Also while another request stores or deletes the same content (the file busy)",
    ),
    507: {
        "model": ErrorBody,
        "description": (
            "no room: the tenant keeps PDPPO_MAX_STORAGE_BYTES_PER_TENANT bytes or more (uploads "
            "and job artifacts: delete jobs or files first, `GET /v1/usage` shows the bytes), or "
            "the server's disk has no room for the file (its Content-Length would leave less than "
            "PDPPO_MIN_FREE_BYTES free, or the disk filled up while it was written); nothing of "
            "it is kept"
        ),
    },
}


def _invalid_file(inspection: Inspection) -> UploadRefused:
    errors: list[dict[str, Any]]
    if inspection.bad_lines == 0:
        errors = [{"loc": ["body", "file"], "msg": "holds no records", "type": "empty_file"}]
    else:
        errors = [
            {"loc": ["body", "file", "line", p.line], "msg": p.message, "type": "invalid_record"}
            for p in inspection.problems
        ]
    return UploadRefused(422, describe_problems(inspection), errors)


async def _check_quota(
    request: Request, files: AsyncFileStore, tenant: str, settings: Settings
) -> None:
    """Refuses before reading the body when the tenant is already at a quota (the exact check
    is at commit). At the file limit even a re-upload of a kept file is refused: its id is not
    known before its bytes are read."""
    count, used = await files.usage(tenant)
    if count >= settings.max_files_per_tenant:
        await drain(request)
        raise HTTPException(
            429,
            detail=(
                f"tenant {tenant!r} has {count} files; the limit is "
                f"{settings.max_files_per_tenant} (PDPPO_MAX_FILES_PER_TENANT): delete some first"
            ),
        )
    # The declared body less the form's own framing (boundaries, part headers) is about the
    # file's size; unknown (chunked): at least one byte.
    declared = request.headers.get("content-length", "")
    incoming = max(int(declared) - FORM_FRAMING_BYTES, 1) if declared.isdigit() else 1
    if used + incoming > settings.max_file_bytes_per_tenant:
        await drain(request)
        raise _bytes_quota(tenant, used, settings)


def _bytes_quota(tenant: str, used: int, settings: Settings) -> HTTPException:
    return HTTPException(
        413,
        detail=(
            f"tenant {tenant!r} keeps {used} bytes of files; this upload would pass the limit of "
            f"{settings.max_file_bytes_per_tenant} (PDPPO_MAX_FILE_BYTES_PER_TENANT): delete "
            "some first"
        ),
    )


@router.post(
    "",
    status_code=201,
    response_model=FileObject,
    responses=_UPLOAD_RESPONSES,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"multipart/form-data": {"schema": UPLOAD_SCHEMA}},
        }
    },
)
async def upload_file(
    request: Request,
    tenant: TenantDep,
    files: FileStoreDep,
    settings: SettingsDep,
    response: Response,
) -> FileObject | JSONResponse:
    """Upload a JSONL dataset (multipart form: `file`, optional `purpose`); 201 with the new
    file, or 200 with the one this tenant already has with the same content. Its `id` goes in
    a job spec's `train.task.file` or `train.task.validation_file`."""
    await _check_quota(request, files, tenant, settings)
    await refuse_over_quota(files.redis, settings, tenant, request=request)
    await refuse_without_room(request, settings, FORM_FRAMING_BYTES)
    storage = FileStorage(settings.artifact_dir)
    try:
        upload = await receive_upload(request, storage, tenant, settings.max_file_bytes)
    except UploadRefused as refused:
        await drain(request)
        return refused.response()
    try:
        inspection = await anyio.to_thread.run_sync(inspect_jsonl, upload.writer.path)
        if not inspection.ok:
            return _invalid_file(inspection).response()
        await refuse_over_quota(files.redis, settings, tenant, incoming=upload.writer.size)
        pending_write(request, "file", file_id_of(upload.sha256), "storing this upload")
        record, created = await _store(
            upload, inspection, storage, files=files, tenant=tenant, settings=settings
        )
    except FileBusy as exc:
        raise _busy(exc) from exc
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(upload.writer.discard)  # nothing, once in place
    if created:
        await anyio.to_thread.run_sync(storage.remove_stale_uploads, tenant)
        await forget_usage(files.redis, tenant)
    else:
        response.status_code = 200
    response.headers["Location"] = f"/v1/files/{record.id}"
    return to_file(record)


async def _store(
    upload: Upload,
    inspection: Inspection,
    storage: FileStorage,
    files: AsyncFileStore,
    tenant: str,
    settings: Settings,
) -> tuple[FileRecord, bool]:
    """Puts the checked upload in place, then writes its record (in that order: a crash in
    between leaves an orphan file that nothing lists, which the next upload of the same content
    replaces); (record, created). The file's lock keeps a concurrent delete of the same content
    from removing the file between the two."""
    file_id = file_id_of(upload.sha256)
    async with files.lock(tenant, file_id):
        # Also when the tenant has the file: the same bytes, and a file lost from disk comes back.
        await anyio.to_thread.run_sync(storage.put, tenant, upload.writer)
        created_at = now_iso()
        record = FileRecord(
            id=file_id,
            tenant=tenant,
            filename=upload.filename,
            bytes=upload.writer.size,
            records=inspection.records,
            sha256=upload.sha256,
            created_at=created_at,
            purpose=upload.purpose,
            member=listing_member(_epoch_ms(created_at), file_id),
        )
        result = await files.create(
            record,
            max_files=settings.max_files_per_tenant,
            max_bytes=settings.max_file_bytes_per_tenant,
        )
        if result.outcome == "existing":
            kept = await files.get(tenant, file_id)
            if kept is not None:
                return kept, False
        if result.outcome in ("files_limit", "bytes_limit"):
            await anyio.to_thread.run_sync(storage.remove, tenant, upload.sha256)
            if result.outcome == "bytes_limit":
                raise _bytes_quota(tenant, result.used, settings)
            raise HTTPException(
                429,
                detail=(
                    f"tenant {tenant!r} has {result.used} files; the limit is "
                    f"{settings.max_files_per_tenant} (PDPPO_MAX_FILES_PER_TENANT): delete some "
                    "first"
                ),
            )
    return record, True


def _epoch_ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


@router.get(
    "",
    response_model=FileList,
    responses={
        400: {
            "model": ErrorBody,
            "description": "`after` is not one of the tenant's files, or both `after` and "
            "`cursor` are given",
        }
    },
)
async def list_files(
    tenant: TenantDep,
    files: FileStoreDep,
    limit: Annotated[int, Query(ge=1, le=100, description="page size")] = 20,
    cursor: Annotated[
        str | None, Query(pattern=CURSOR_PATTERN, description="next_cursor of the last page")
    ] = None,
    after: Annotated[
        str | None,
        Query(pattern=FILE_ID_PATTERN, description="OpenAI's cursor: the last id of the last page"),
    ] = None,
    order: Annotated[
        Literal["asc", "desc"], Query(description="by upload time: desc is newest first")
    ] = "desc",
    purpose: Annotated[
        str | None,
        Query(max_length=64, description="only the files uploaded with this `purpose`"),
    ] = None,
) -> FileList:
    """The caller's own files, newest first (`order=asc`: oldest first), `limit` a page.

    Two kinds of client page through here: pdppo's (`items`, `next_cursor` sent back as
    `cursor`) and OpenAI's SDK (`data`, `has_more`, and the last item's id sent back as
    `after`). One answer serves both, so the page carries both shapes: `data` repeats `items`.
    Telling the clients apart instead (the SDK's first request has no `after`) would rest on
    headers such as its User-Agent; the repeat doubles the page's bytes (bench/
    files_list_payload.py: 20 files 11.1 kB, was 5.5 kB; 100 files 54.8 kB, was 27.3 kB) and
    adds ~0.1 ms to a listing's ~1 ms, small beside a request's round trip.
    A file id does not sort (it derives from the content), so `after` is looked up as the
    file's place in the listing: a file deleted since the last page is a 400, not a guess."""
    if after is not None:
        if cursor is not None:
            raise HTTPException(400, detail="give `after` or `cursor`, not both")
        found = await files.get(tenant, after)
        if found is None:
            raise HTTPException(
                400,
                detail=f"after: file {after!r} is not among your files (deleted since the last "
                "page?); list again from the start",
            )
        cursor = found.member
    records, next_cursor = await files.list_files(
        tenant, limit=limit, cursor=cursor, ascending=order == "asc", purpose=purpose
    )
    page = [to_file(r) for r in records]
    return FileList(
        items=page,
        next_cursor=next_cursor,
        data=page,
        has_more=next_cursor is not None,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
    )


@router.get("/{file_id}", response_model=FileObject)
async def get_file(file: FileDep) -> FileObject:
    return to_file(file)


@router.get(
    "/{file_id}/content",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
            "description": "the file's bytes, as uploaded",
        }
    },
)
async def file_content(file: FileDep, settings: SettingsDep) -> StreamingResponse:
    """The file's content, as uploaded (JSONL)."""
    path = FileStorage(settings.artifact_dir).path(file.tenant, file.sha256)
    try:
        fh: BinaryIO = await anyio.to_thread.run_sync(path.open, "rb")
    except FileNotFoundError:
        raise HTTPException(
            404, detail=f"file {file.id!r} has no content on this server; upload it again"
        ) from None

    async def chunks() -> AsyncIterator[bytes]:
        try:
            while data := await anyio.to_thread.run_sync(fh.read, READ_CHUNK):
                yield data
        finally:
            fh.close()

    return StreamingResponse(
        chunks(),
        media_type=CONTENT_TYPE,
        headers={
            "Content-Length": str(os.fstat(fh.fileno()).st_size),
            "Content-Disposition": f'attachment; filename="{file.id}.jsonl"',
        },
    )


@router.delete(
    "/{file_id}",
    response_model=FileDeleted,
    responses={
        200: {"description": "the file is gone, its bytes freed unless ended jobs still link it"},
        409: {
            "model": ErrorBody,
            "description": "queued, running or paused jobs name the file (the detail lists them)",
        },
    },
)
async def delete_file(file: FileDep, files: FileStoreDep, settings: SettingsDep) -> FileDeleted:
    """200 and OpenAI's deletion object: the file is gone, record first, then its bytes. (A 204
    until OpenAI's SDK came to call it: it reads that object; pdppo's client reads no body and
    takes either.) 409 while a queued, running or paused job of the tenant names it. Ended jobs
    keep their own link to it (freed when the job is deleted, or its artifacts expire)."""
    storage = FileStorage(settings.artifact_dir)
    try:
        async with files.lock(file.tenant, file.id):
            deleted = await AsyncDeletion(files.redis).delete_file(file.tenant, file.id)
            if deleted.outcome == "missing":  # deleted by another request in between
                raise HTTPException(404, detail=f"file {file.id!r} not found")
            if deleted.outcome == "used":
                raise HTTPException(409, detail=_in_use(file.id, deleted.users))
            await anyio.to_thread.run_sync(storage.remove, file.tenant, deleted.sha256)
    except FileBusy as exc:
        raise _busy(exc) from exc
    await forget_usage(files.redis, file.tenant)
    return FileDeleted(id=file.id)


def _in_use(file_id: str, jobs: tuple[str, ...]) -> str:
    return (
        f"file {file_id!r} is named by jobs that have not ended: {', '.join(jobs)}; delete it "
        "once they have ended (or cancel them)"
    )


__all__ = ["router"]
