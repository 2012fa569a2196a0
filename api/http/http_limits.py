"""HTTP limits uvicorn lacks: how long a request's head and body may take, and a 431 that arrives.

uvicorn closes a keep-alive connection idle between requests (`timeout_keep_alive`) and caps
connections (`limit_concurrency`, a 503 past it), but never times out a request being received:
800 connections sending a body at 1 byte/s and 300 sending headers slowly were all open after
70 s (issue 37), each holding a connection slot and, for bodies, an ASGI task. And a head past
h11's buffer limit got a 400 written onto a socket closed with the rest of the head unread, which
the kernel turns into a reset: the client saw a dropped connection, not an answer.

`LimitedH11Protocol` is uvicorn's h11 protocol with, per request:

- a head deadline: the request line and headers must arrive within `http_header_timeout_seconds`
  of their first byte (of the connection's opening, for the first request: a connection that
  never sends anything is closed too);
- a body allowance: `http_body_timeout_seconds`, plus one second for every `http_body_min_rate`
  bytes received, so an upload at any fair speed is never cut off while a trickle is. Time the
  server spends not reading (flow control: the app is slower than the client) does not count;
- past either, a 408; a head over `http_max_header_bytes` gets a 431 (not uvicorn's 400);
- a connection past `http_max_connections` open gets a 503 at once, before its request, so
  that it holds its slot for no longer than the answer takes (uvicorn's `limit_concurrency`
  would read its request first, however slowly it came, to answer a bare-text 503).

Each answer is written, the sending side shut, and what the client still sends is read and
dropped for a moment before the connection closes, so the answer arrives instead of a reset.
Nothing times out once a request is received: a response streams as long as it needs (event
streams live for hours). The limits come from the settings (`PDPPO_HTTP_*`), read in each server
process: uvicorn imports this class by name (`pdppo serve`), so it also works with `--workers`.
"""

from __future__ import annotations

import asyncio
import http
import json
import time
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from pdppo.settings import Settings, get_settings

LINGER_SECONDS = 2.0
"""How long a refused client's further bytes are read and dropped before the close."""
PROTOCOL = "api.http.http_limits:LimitedH11Protocol"
RETRY_AFTER_SECONDS = 1


@dataclass(frozen=True)
class HttpLimits:
    header_timeout: float
    body_timeout: float
    body_min_rate: int
    max_header_bytes: int
    max_connections: int

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpLimits:
        return cls(
            header_timeout=settings.http_header_timeout_seconds,
            body_timeout=settings.http_body_timeout_seconds,
            body_min_rate=settings.http_body_min_rate,
            max_header_bytes=settings.http_max_header_bytes,
            max_connections=settings.http_max_connections,
        )


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """What `uvicorn.run` takes for these limits (the protocol reads the rest itself)."""
    return {"http": PROTOCOL, "h11_max_incomplete_event_size": settings.http_max_header_bytes}


def _answer(status: int, detail: str) -> bytes:
    """A complete `{"detail": ...}` response (the API's ErrorBody) that closes the connection."""
    body = json.dumps({"detail": detail}).encode()
    phrase = http.HTTPStatus(status).phrase
    retry = f"retry-after: {RETRY_AFTER_SECONDS}\r\n" if status == 503 else ""
    head = (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n{retry}"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with head and body deadlines and a 431 (module docstring)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = HttpLimits.from_settings(get_settings())
        self._phase: str | None = None  # "head" or "body" while one is being received
        self._started = 0.0
        self._body_bytes = 0
        self._not_reading = 0.0  # seconds of this body's phase that reading was paused
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                503,
                f"this server has {self.limits.max_connections} connections open "
                "(PDPPO_HTTP_MAX_CONNECTIONS); try again shortly",
            )
            return
        self._begin("head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered already: read and dropped until the close
        if self._phase == "body":
            self._body_bytes += len(data)
        elif self._phase is None and self.conn.their_state is h11.IDLE:
            self._begin("head")  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if self._refused:
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY and self._phase != "body":
            self._begin("body")
        elif state not in (h11.IDLE, h11.SEND_BODY):
            self._phase = None  # received whole: the response takes as long as it takes
            self._cancel_timer()

    def send_400_response(self, msg: str) -> None:
        """h11 refused the head; past the size limit that is a 431, and either way an answer
        the client gets to read."""
        if len(self.conn.trailing_data[0]) > self.limits.max_header_bytes:
            self._refuse(
                431,
                f"request line and headers over {self.limits.max_header_bytes} bytes "
                "(PDPPO_HTTP_MAX_HEADER_BYTES)",
            )
        else:
            self._refuse(400, msg)

    def _begin(self, phase: str) -> None:
        self._phase = phase
        self._started = time.monotonic()
        self._body_bytes = 0
        self._not_reading = 0.0
        self._schedule(self._deadline())

    def _deadline(self) -> float:
        if self._phase == "head":
            return self._started + self.limits.header_timeout
        allowance = self.limits.body_timeout + self._body_bytes / self.limits.body_min_rate
        return self._started + self._not_reading + allowance

    def _schedule(self, deadline: float) -> None:
        self._cancel_timer()
        self._timer = self.loop.call_later(max(deadline - time.monotonic(), 0.0), self._check)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        if self._phase is None or self._refused or self.transport.is_closing():
            return
        if self._phase == "body" and self.flow.read_paused:
            # The app has not taken what came; the client is not the slow one. Look again later.
            self._not_reading += 1.0
            self._schedule(time.monotonic() + 1.0)
            return
        deadline = self._deadline()
        if time.monotonic() < deadline:
            self._schedule(deadline)  # bytes came meanwhile and extended it
            return
        if self._phase == "head":
            detail = (
                f"request line and headers not received within "
                f"{self.limits.header_timeout:g}s (PDPPO_HTTP_HEADER_TIMEOUT_SECONDS)"
            )
        else:
            detail = (
                f"request body too slow: {self._body_bytes} bytes in "
                f"{time.monotonic() - self._started:.0f}s (PDPPO_HTTP_BODY_TIMEOUT_SECONDS, "
                "PDPPO_HTTP_BODY_MIN_RATE)"
            )
        self.logger.info("closing a connection from %s: %s", self.client, detail)
        if self._phase == "body" and self.cycle is not None:
            # The app waiting for the body hears a disconnect and sends nothing more.
            started = self.cycle.response_started
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            if started:
                self.transport.close()
                return
        self._refuse(408, detail)

    def _refuse(self, status: int, detail: str) -> None:
        """Answers `status` and closes, reading and dropping what still comes meanwhile."""
        self._refused = True
        self._phase = None
        self._cancel_timer()
        if self.transport.is_closing():
            return
        self.transport.write(_answer(status, detail))
        if self.flow.read_paused:
            self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)
