"""The official `openai` SDK over an ASGI transport to the real app in this process, with a real
redis-server and no worker (`run`), and a small job to create with it (tests/api/test_openai_*.py,
bench/openai_list_metadata.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
from openai import AsyncOpenAI

from api.app import create_app
from pdppo.settings import Settings
from tests.support.inprocess import KEYS

GRADER = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}


METHOD = {"type": "reinforcement", "reinforcement": {"grader": GRADER}}


SMALL = {"train": {"steps": 2, "model": {"tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2}}}}


ROWS = b"".join(
    json.dumps({"messages": [{"role": "user", "content": f"{i}="}], "answer": str(i)}).encode()
    + b"\n"
    for i in range(8)
)


def run(settings: Settings, work: Any, api_key: str = KEYS["alice"]) -> Any:
    """`work(sdk)` with an AsyncOpenAI client holding `api_key` (alice's), talking to the app
    in this process."""
    app = create_app(settings.model_copy(update={"api_publish_tasks": False}))

    async def main() -> Any:
        async with app.router.lifespan_context(app):
            transport = httpx2.ASGITransport(app=app)
            http = httpx2.AsyncClient(transport=transport, base_url="http://api")
            async with AsyncOpenAI(
                base_url="http://api/v1",
                api_key=api_key,
                http_client=http,
                max_retries=0,
            ) as sdk:
                return await work(sdk)

    return asyncio.run(main())


async def upload(sdk: AsyncOpenAI, content: bytes = ROWS) -> str:
    return (await sdk.files.create(file=("d.jsonl", content), purpose="fine-tune")).id


async def create(sdk: AsyncOpenAI, **extra: Any) -> Any:
    return await sdk.fine_tuning.jobs.create(
        model="builtin:tiny",
        training_file=await upload(sdk),
        method=METHOD,  # type: ignore[arg-type]
        extra_body={"pdppo": SMALL},
        **extra,
    )
