"""The dashboard: a static page app (`api/static`) served by the API itself, under `/ui/`.

No build step and no CDN: plain HTML, CSS and JS, with its two libraries vendored
(`api/static/vendor/README.md`), so it works offline and from the same origin as the API it
calls. The files hold no data and need no key; everything the page shows comes from `/v1` with
the key the user types, as the CLI's would. `GET /` sends a browser to it.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

STATIC = Path(__file__).parent / "static"
router = APIRouter(include_in_schema=False)


class DashboardFiles(StaticFiles):
    """Static files with a content security policy: scripts and styles from this origin only
    (the page's own code and the vendored libraries), fetches to this origin only."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'"
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/ui/")


def mount_dashboard(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui", DashboardFiles(directory=STATIC, html=True), name="ui")
