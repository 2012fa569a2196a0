"""The API's documentation pages, `/docs` (Swagger UI) and `/redoc` (ReDoc), in a headless
Chromium that reaches nothing but this machine (the `page` fixture aborts and records every
other request): both list the operations, without an API key, from the vendored libraries."""

from __future__ import annotations

from typing import Any

from tests.support.stack import Service

TIMEOUT_MS = 30_000


def test_swagger_ui_lists_the_operations_offline(
    page: Any, service: Service, external: list[str], refused: list[str]
) -> None:
    response = page.goto(service.base_url + "/docs")
    assert response.status == 200
    create = page.wait_for_selector(
        ".opblock-post:has(.opblock-summary-path[data-path='/v1/jobs'])", timeout=TIMEOUT_MS
    )
    assert "Create Job" in create.inner_text()
    assert page.locator(".opblock").count() >= 20  # every operation, not only the first
    assert page.locator(".opblock-summary-path[data-path='/docs']").count() == 0
    # the schema's own validator badge would send the schema to validator.swagger.io
    assert page.locator(".swagger-ui img[src*='validator']").count() == 0
    icon = page.evaluate("() => document.querySelector('link[rel~=icon]').href")
    assert icon == service.base_url + "/ui/vendor/favicon-32x32.png"
    assert page.request.get(icon).status == 200
    assert external == [] and refused == []


def test_redoc_lists_the_operations_offline(
    page: Any, service: Service, external: list[str], refused: list[str]
) -> None:
    response = page.goto(service.base_url + "/redoc")
    assert response.status == 200
    page.wait_for_selector("h2:text-is('Create Job')", timeout=TIMEOUT_MS)
    verbs = page.locator("[data-section-id='operation/create_job_v1_jobs_post'] .http-verb")
    assert verbs.first.inner_text().lower() == "post"
    assert page.locator("h2:text-is('List Jobs')").count() == 1
    page.wait_for_load_state("networkidle")  # fonts and images asked for late, too
    # nothing asked for elsewhere, nor refused by the page's policy: the bundle's CDN logo (which
    # the policy used to refuse) is taken out (api/static/vendor/README.md)
    assert external == [] and refused == []
