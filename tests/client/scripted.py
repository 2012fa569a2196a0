"""A scripted HTTP server for the client's unit tests: the cases a live stack cannot produce on
demand (a 409 after a cancel that landed behind a 503, a stream cut at a given event)."""

from __future__ import annotations

from collections.abc import Callable

import httpx


def scripted(
    responses: list[Callable[[httpx.Request], httpx.Response]],
) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """A transport answering the n-th request with `responses[n]` (the last one from then on),
    and the requests it saw, in order."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return responses[min(len(seen), len(responses)) - 1](request)

    return httpx.MockTransport(handler), seen
