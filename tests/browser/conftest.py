"""The dashboard in a real headless Chromium (Debian's `chromium` package), driven by Playwright
for Python through `executable_path`: no browser download. The main test run does not install
Playwright: these tests run in a CI step of their own (`.ci/browser`). Without Playwright or a
Chromium they are not collected at all, so `pytest tests/browser` then fails with "no tests ran"
instead of passing.

Every page runs offline: a request to anywhere but this machine is aborted and recorded, and a
test fails if there was any (the service must work on a network that reaches nothing else). A
load that the page's content security policy refused never became a request; those are recorded
too, and only the one known below is let through.

Each test module gets a redis-server and a service of its own (`redis_server` and `service`,
module-scoped here over tests/conftest.py's session ones): what one module's jobs leave on the
dashboard is never on another's."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack import RedisServer, Service, running_redis, running_service


def chromium_path() -> str | None:
    return os.environ.get("PDPPO_CHROMIUM") or shutil.which("chromium")


collect_ignore_glob = (
    [] if importlib.util.find_spec("playwright") is not None and chromium_path() else ["test_*.py"]
)

ARTIFACTS = Path(os.environ.get("PDPPO_BROWSER_ARTIFACTS", Path(__file__).parent / "artifacts"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium, for one test file. Not the session's: Playwright's sync API keeps an asyncio
    loop running in its thread while it is open, and README's suite (`-n auto`) runs these
    files among the others in the same workers, whose `asyncio.run` then fails."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield chromium
        finally:
            chromium.close()


# Any URL but one of this machine's (the service, the tests' proxies): http(s), ws(s), ftp...
NOT_LOCAL = re.compile(r"^(?![a-z]+://(127\.0\.0\.1|localhost|\[::1\])[:/])[a-z]+://")


@pytest.fixture
def external() -> list[str]:
    """The URLs elsewhere that the page requested (each aborted)."""
    return []


@pytest.fixture
def refused() -> list[str]:
    """The URLs elsewhere that the page's content security policy refused to load."""
    return []


@pytest.fixture
def page(browser: Any, external: list[str], refused: list[str]) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    # Playwright's default of 30 s per action ran out once, for the login form's first paint,
    # while another CI run loaded the same 2 cores (stop 51's notes); 60 s, as the tests' waits.
    context.set_default_timeout(60_000)

    def abort(route: Any) -> None:
        external.append(route.request.url)
        route.abort("internetdisconnected")

    def console(message: Any) -> None:
        if "Content Security Policy" in message.text:
            refused.extend(re.findall(r"'([a-z]+://[^']+)'", message.text) or [message.text])

    context.route(NOT_LOCAL, abort)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", console)
    try:
        yield page
        assert errors == [], errors  # no uncaught exception in the page's code
        assert external == [], external  # nothing requested from outside this machine
        assert refused == [], refused  # nor refused by its content security policy
    finally:
        context.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    yield from running_redis(tmp_path_factory.mktemp("redis"))


@pytest.fixture(scope="module")
def service(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    yield from running_service(redis_server, tmp_path_factory.mktemp("service"))
