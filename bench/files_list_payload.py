"""What OpenAI's list fields cost a page of `GET /v1/files`: the page answers pdppo's `items`
and, for the `openai` SDK, `data` (the same files again, see `api.routes.files.list_files`).

Uploads N small files to the real app (in-process, a real redis-server), reads pages of 20 and
100, and prints each answer's bytes beside the same answer less `data` (re-serialized the way
the app writes JSON), and the time per listing. Run:

    PYTHONPATH=$PWD .venv/bin/python bench/files_list_payload.py
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from api.app import create_app
from pdppo.settings import Settings
from tests.support.stack import RedisServer

KEY = "alice-key-0123456789"


async def measure(settings: Settings, files: int, pages: tuple[int, ...]) -> None:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://api", headers=headers
        ) as http:
            for i in range(files):
                row = json.dumps({"messages": [{"role": "user", "content": f"{i}="}]})
                form = {"file": ("train.jsonl", row.encode() + b"\n", "application/x-ndjson")}
                made = await http.post("/v1/files", files=form, data={"purpose": "fine-tune"})
                assert made.status_code == 201, made.text
            for limit in pages:
                answer = await http.get("/v1/files", params={"limit": limit})
                body = answer.json()
                without = {k: v for k, v in body.items() if k != "data"}
                native = json.dumps(without, separators=(",", ":")).encode()
                start = time.perf_counter()
                for _ in range(20):
                    await http.get("/v1/files", params={"limit": limit})
                per = (time.perf_counter() - start) / 20 * 1000
                print(
                    f"limit={limit}: {len(answer.content)} bytes with data, {len(native)} without "
                    f"({len(answer.content) / len(native):.2f}x); {per:.1f} ms a listing"
                )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis")
        try:
            settings = Settings(  # type: ignore[call-arg]
                redis_url=server.url(0),
                api_keys=f"alice:{KEY}",
                artifact_dir=Path(tmp) / "artifacts",
                min_free_bytes=0,
                _env_file=None,
            )
            asyncio.run(measure(settings, 100, (20, 100)))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
