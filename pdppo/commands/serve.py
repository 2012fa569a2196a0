"""`pdppo serve`: the HTTP gateway under uvicorn."""

from __future__ import annotations

import click

from pdppo.extras import SERVER_MODULES, need_extra


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to bind.")
@click.option("--workers", default=1, show_default=True, type=int, help="uvicorn processes.")
@click.option("--log-level", default=None, help="uvicorn log level (default: PDPPO_LOG_LEVEL).")
def serve(host: str, port: int, workers: int, log_level: str | None) -> None:
    """Run the API (settings from PDPPO_* environment variables)."""
    need_extra("pdppo serve", "server", SERVER_MODULES)
    import uvicorn

    from api.http.http_limits import uvicorn_options
    from pdppo.settings import get_settings

    settings = get_settings()  # fail here, readably, on bad settings
    uvicorn.run(
        "api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=(log_level or settings.log_level).lower(),
        timeout_graceful_shutdown=5,
        # h11 (api.http.http_limits adds read timeouts and a 431 to uvicorn's h11 protocol), even
        # with httptools installed: httptools answers a request with a made-up method (or a
        # lowercase one) with its own 400 before the app sees it, so such requests would go
        # uncounted and unanswered by the API's error model (tests/integration/test_contract)
        **uvicorn_options(settings),
    )
