"""The dashboard in a real headless Chromium (Debian's `chromium` package), driven by Playwright
for Python through `executable_path`: no browser download. The main test run does not install
Playwright: these tests run in a CI step of their own (`.ci/browser`). Without Playwright or a
Chromium they are not collected at all, so `pytest tests/browser` then fails with "no tests ran"
instead of passing."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def chromium_path() -> str | None:
    return os.environ.get("PDPPO_CHROMIUM") or shutil.which("chromium")


collect_ignore_glob = (
    [] if importlib.util.find_spec("playwright") is not None and chromium_path() else ["test_*.py"]
)

ARTIFACTS = Path(os.environ.get("PDPPO_BROWSER_ARTIFACTS", Path(__file__).parent / "artifacts"))


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
        assert errors == [], errors  # no uncaught exception in the page's code
    finally:
        context.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
