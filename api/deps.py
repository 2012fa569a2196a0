"""Request dependencies as typed aliases: settings, the stores, the caller's tenant, its job and
its uploaded files."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.jobs.publisher import TaskPublisher
from api.streaming.events import EventHub
from pdppo.settings import Settings
from pdppo.store import AsyncFileStore, AsyncJobStore, FileRecord, JobRecord

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")


async def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_store(request: Request) -> AsyncJobStore:
    store: AsyncJobStore = request.app.state.store
    return store


async def get_hub(request: Request) -> EventHub:
    hub: EventHub = request.app.state.hub
    return hub


async def get_publisher(request: Request) -> TaskPublisher:
    publisher: TaskPublisher = request.app.state.publisher
    return publisher


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
PublisherDep = Annotated[TaskPublisher, Depends(get_publisher)]
StoreDep = Annotated[AsyncJobStore, Depends(get_store)]
HubDep = Annotated[EventHub, Depends(get_hub)]


async def get_tenant(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The tenant owning the bearer key; compares against every key in constant time."""
    unauthorized = HTTPException(
        401, detail="missing or invalid API key", headers={"WWW-Authenticate": "Bearer"}
    )
    if credentials is None:
        raise unauthorized
    presented = credentials.credentials.encode()
    tenant: str | None = None
    for key, owner in settings.tenants_by_key.items():
        if hmac.compare_digest(presented, key.encode()):
            tenant = owner
    if tenant is None:
        raise unauthorized
    return tenant


TenantDep = Annotated[str, Depends(get_tenant)]


async def require_metrics_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """`PDPPO_METRICS_TOKEN`, when set, as a bearer token: the job counts and latencies of every
    tenant are operators' business. A tenant's API key does not open it."""
    token = settings.metrics_token
    if not token:
        return
    presented = credentials.credentials.encode() if credentials is not None else b""
    if not hmac.compare_digest(presented, token.encode()):
        raise HTTPException(
            401, detail="missing or invalid metrics token", headers={"WWW-Authenticate": "Bearer"}
        )


async def get_owned_job(
    job_id: Annotated[str, Path(description="the job id", max_length=64)],
    tenant: TenantDep,
    store: StoreDep,
) -> JobRecord:
    """The job if the caller's tenant owns it; another tenant's job is indistinguishable: 404."""
    record = await store.get(job_id)
    if record is None or record.tenant != tenant:
        raise HTTPException(404, detail=f"job {job_id!r} not found")
    return record


JobDep = Annotated[JobRecord, Depends(get_owned_job)]


async def get_file_store(store: StoreDep) -> AsyncFileStore:
    """The job store's file records (same Redis client: a Redis error is the same 503)."""
    return store.files


FileStoreDep = Annotated[AsyncFileStore, Depends(get_file_store)]


async def get_owned_file(
    file_id: Annotated[str, Path(description="the file id, file-<32 hex>", max_length=64)],
    tenant: TenantDep,
    files: FileStoreDep,
) -> FileRecord:
    """The caller's file. File ids come from the content, so another tenant may hold the same
    id: records are per tenant, and theirs is simply not found here (404)."""
    record = await files.get(tenant, file_id)
    if record is None:
        raise HTTPException(404, detail=f"file {file_id!r} not found")
    return record


FileDep = Annotated[FileRecord, Depends(get_owned_file)]
