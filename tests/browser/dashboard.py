"""What the dashboard tests share: logging in, waiting on the page's test probe, a long spec."""

from __future__ import annotations

from typing import Any

import yaml

from tests.support.stack import REPO

TIMEOUT_MS = 60_000


def probe(page: Any) -> dict[str, Any]:
    return dict(page.evaluate("() => ({...window.pdppoDashboard})"))


def wait_probe(page: Any, condition: str, timeout_ms: int = TIMEOUT_MS) -> dict[str, Any]:
    page.wait_for_function(
        f"() => {{ const p = window.pdppoDashboard; return {condition}; }}", timeout=timeout_ms
    )
    return probe(page)


def login(page: Any, base_url: str, key: str) -> None:
    page.goto(base_url + "/")  # redirected to /ui/
    page.fill("#api-key", key)
    page.click("#login")


def long_spec() -> str:
    spec = yaml.safe_load((REPO / "examples" / "smoke.yaml").read_text())
    spec["train"].update(steps=3000, checkpoint_every=0)
    return yaml.safe_dump(spec, sort_keys=False)
