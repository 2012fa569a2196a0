"""Uploading files to the started service, and the id a content gets."""

from __future__ import annotations

import hashlib

import httpx


def upload(
    client: httpx.Client, content: bytes, name: str = "data.jsonl", purpose: str | None = None
) -> httpx.Response:
    data = {"purpose": purpose} if purpose else None
    return client.post("/v1/files", files={"file": (name, content)}, data=data)


def file_id(content: bytes) -> str:
    return "file-" + hashlib.sha256(content).hexdigest()[:32]
