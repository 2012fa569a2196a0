"""How `pdppo serve` holds up under load: event streams, its Redis connections, slow or greedy
HTTP clients and its readiness probe. `pdppo.settings.Settings` inherits these fields (one
settings object, read from `PDPPO_*`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings


class HttpSettings(BaseSettings):
    # Event streams under load (api.streaming.events): past either limit GET /v1/jobs/{id}/events
    # answers 429 with Retry-After. Per API process (`pdppo serve --workers N` allows N times as
    # many).
    sse_max_streams: int = Field(
        default=2000,
        ge=1,
        description=(
            "open event streams one API process serves at once; each watched job also holds "
            "one Redis connection for its live reader"
        ),
    )
    sse_max_streams_per_tenant: int = Field(
        default=500, ge=1, description="open event streams of one tenant in one API process"
    )
    api_redis_max_connections: int = Field(
        default=64,
        ge=4,
        description=(
            "Redis connections the API's requests share (event streams' live readers have "
            "their own); a request waits for one rather than opening more"
        ),
    )

    # HTTP limits of `pdppo serve` (api.http.http_limits): a client that sends too slowly, a huge
    # header or one connection too many is answered and cut off; the others keep being served.
    http_header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description=(
            "a request's line and headers must arrive within this from their first byte (or from "
            "the connection's opening); past it the client gets 408 and the connection is closed"
        ),
    )
    http_body_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description=(
            "a request body may take this long, plus a second for every PDPPO_HTTP_BODY_MIN_RATE "
            "bytes received (a large upload at a fair speed is never cut off); past it 408 and "
            "the connection is closed. Time the server itself spends not reading does not count"
        ),
    )
    http_body_min_rate: int = Field(
        default=1024, ge=1, description="bytes per second that extend a body's time (see above)"
    )
    http_max_header_bytes: int = Field(
        default=65_536,
        ge=1024,
        le=16 * 2**20,
        description="a request line and headers larger than this get 431 (connection closed)",
    )
    http_max_connections: int = Field(
        default=4096,
        ge=1,
        description=(
            "open connections one API process keeps (event streams included: keep it above "
            "PDPPO_SSE_MAX_STREAMS); a request that comes past it gets 503"
        ),
    )
    readyz_timeout_seconds: float = Field(
        default=1.5,
        gt=0,
        le=60,
        description="GET /readyz answers 503 when Redis has not answered a PING within this",
    )
