"""`/docs` (Swagger UI) and `/redoc` (ReDoc) from the vendored copies in `api/static/vendor`.

FastAPI's own pages load both from a CDN, ReDoc a Google font too, and their favicon from
fastapi.tiangolo.com: without internet (an air-gapped cluster, a laptop on a train) `/docs` was
a blank page. These are the same pages with every URL on this server, Swagger UI's validator
badge off (it sends the schema to validator.swagger.io), and a content security policy that
refuses anything from elsewhere, so a future version of either library that reaches out fails
loudly in the browser tests rather than silently in a user's. Like `/openapi.json` they need no
API key and stay out of the schema.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

VENDOR = "/ui/vendor"
FAVICON = f"{VENDOR}/favicon-32x32.png"
# Swagger UI's page starts it from an inline script and ReDoc styles itself inline; ReDoc runs
# its search index in a worker made from a blob. Everything else comes from this origin.
POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; worker-src 'self' blob:; font-src 'self' data:"
)
HEADERS = {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff"}


def _with_policy(page: HTMLResponse) -> HTMLResponse:
    page.headers.update(HEADERS)
    return page


def mount_docs(app: FastAPI) -> None:
    """Serves the two pages; the app must be made with `docs_url=None, redoc_url=None`."""
    title = f"{app.title} API"
    openapi_url = app.openapi_url or "/openapi.json"
    router = APIRouter(include_in_schema=False)

    @router.get("/docs")
    async def swagger_ui() -> HTMLResponse:
        return _with_policy(
            get_swagger_ui_html(
                openapi_url=openapi_url,
                title=title,
                swagger_js_url=f"{VENDOR}/swagger-ui-bundle.js",
                swagger_css_url=f"{VENDOR}/swagger-ui.css",
                swagger_favicon_url=FAVICON,
                swagger_ui_parameters={"validatorUrl": None},
            )
        )

    @router.get("/redoc")
    async def redoc() -> HTMLResponse:
        return _with_policy(
            get_redoc_html(
                openapi_url=openapi_url,
                title=title,
                redoc_js_url=f"{VENDOR}/redoc.standalone.js",
                redoc_favicon_url=FAVICON,
                with_google_fonts=False,
            )
        )

    app.include_router(router)
