"""What `bench/api_load.py` measures with: a lean HTTP/1.1 client, CPU and memory readings of
processes, percentiles. Apart so that the bench itself reads as its three phases."""

from __future__ import annotations

import asyncio
import os
import resource
import sys
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.stack import KEYS

AUTH = {"Authorization": f"Bearer {KEYS['alice']}"}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Refused(Exception):
    """A request answered with another status than 200 (a 429 past the stream limits, a 503)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class RawClient:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams: costs the bench far less CPU
    than httpx, so that on a small machine the figures describe the server, not the client."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def send(self, method: str, path: str, body: bytes = b"") -> None:
        assert self.writer is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Authorization: {AUTH['Authorization']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()

    async def head(self) -> tuple[int, dict[str, str]]:
        assert self.reader is not None
        status = int((await self.reader.readline()).split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def chunk(self) -> bytes:
        assert self.reader is not None
        size = int((await self.reader.readline()).strip(), 16)
        data = await self.reader.readexactly(size + 2)
        return data[:-2]

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        assert self.reader is not None
        await self.send(method, path, body)
        status, headers = await self.head()
        if "content-length" in headers:
            return status, await self.reader.readexactly(int(headers["content-length"]))
        parts = []
        while part := await self.chunk():
            parts.append(part)
        return status, b"".join(parts)

    async def events(self, path: str) -> AsyncIterator[tuple[str, str]]:
        """(id, event) of each SSE frame; comments (pings) skipped."""
        await self.send("GET", path)
        status, _ = await self.head()
        if status != 200:
            raise Refused(status)
        buffer = b""
        while chunk := await self.chunk():
            buffer += chunk
            *frames, buffer = buffer.split(b"\r\n\r\n")
            for frame in frames:
                fields = dict(
                    line.split(": ", 1) for line in frame.decode().split("\r\n") if ": " in line
                )
                if "id" in fields:
                    yield fields["id"], fields.get("event", "message")

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def probe_ms(rows: list[tuple[float, int]]) -> list[float]:
    """Milliseconds of each probe, inf for one that failed or was not a 200."""
    return [ms if status == 200 else float("inf") for ms, status in rows]
