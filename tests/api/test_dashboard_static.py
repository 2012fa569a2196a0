"""The dashboard's files and the API's docs pages (`/docs`, `/redoc`): served by the API with a
same-origin content policy, shipped in the package, loading nothing from elsewhere, and the
vendored libraries exactly the ones `api/static/vendor/README.md` names. (The pages themselves
are tested in a real Chromium: tests/browser.)"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import re
import tomllib
from pathlib import Path

import httpx

from api.app import create_app
from api.dashboard import STATIC
from pdppo.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def get(paths: list[str]) -> list[httpx.Response]:
    """The app answers static files without its lifespan: no Redis is involved."""
    app = create_app(Settings(redis_url="redis://127.0.0.1:1/0", _env_file=None))  # type: ignore[call-arg]

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return [await client.get(path) for path in paths]

    return asyncio.run(run())


def test_the_root_sends_a_browser_to_the_dashboard_which_is_served_with_a_strict_policy() -> None:
    root, page, script, vendored, missing = get(
        ["/", "/ui/", "/ui/app.js", "/ui/vendor/uPlot.iife.min.js", "/ui/nope.js"]
    )
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="app.js"></script>' in page.text
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src" not in policy  # no inline scripts
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.text == (STATIC / "app.js").read_text()
    assert vendored.status_code == 200 and vendored.text.startswith(
        "/*! https://github.com/leeoniya/uPlot (v1.6.32) */"
    )
    assert missing.status_code == 404


def test_the_page_loads_nothing_from_another_origin() -> None:
    html = (STATIC / "index.html").read_text()
    targets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert targets and all(not re.match(r"^[a-z]+://|^//", t) for t in targets), targets
    scripts = [t for t in targets if t.endswith(".js") and not t.startswith("vendor/")]
    assert scripts == ["charts.js", "job.js", "experiment.js", "app.js"]
    for script in scripts:
        code = (STATIC / script).read_text()
        assert "EventSource" not in code.replace("not EventSource", "")  # keys never in a URL
        assert not re.search(r"https?://", code), script


def test_every_static_file_ships_in_the_package() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["api"]
    files = [p.relative_to(STATIC.parent).as_posix() for p in STATIC.rglob("*") if p.is_file()]
    assert "static/app.js" in files and len(files) >= 9
    unshipped = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert unshipped == []


def test_the_vendored_files_are_the_ones_the_vendor_readme_names() -> None:
    table = (STATIC / "vendor" / "README.md").read_text()
    rows = re.findall(
        r"^\| `([^`]+)` \| \[([a-z-]+)\]\S* [^|]*\| ([0-9.]+) \| `([0-9a-f]{64})` \| ([^|]+) \|$",
        table,
        flags=re.M,
    )
    assert {name: (package, version) for name, package, version, _, _ in rows} == {
        "uPlot.iife.min.js": ("uplot", "1.6.32"),
        "uPlot.min.css": ("uplot", "1.6.32"),
        "js-yaml.umd.min.js": ("js-yaml", "5.5.0"),
        "swagger-ui-bundle.js": ("swagger-ui-dist", "5.35.0"),
        "swagger-ui.css": ("swagger-ui-dist", "5.35.0"),
        "favicon-32x32.png": ("swagger-ui-dist", "5.35.0"),
        "redoc.standalone.js": ("redoc", "2.5.4"),
    }
    for name, package, version, digest, licence in rows:
        assert hashlib.sha256((STATIC / "vendor" / name).read_bytes()).hexdigest() == digest, name
        # the tarball it came from, with its own digest, and the licence files that came with it
        assert re.search(rf"{package}-{version}\.tgz `[0-9a-f]{{64}}`", table), package
        for named in re.findall(r"`([^`]+)`", licence):
            assert (STATIC / "vendor" / named).stat().st_size > 0, named
    licences = {
        "uPlot.LICENSE": "MIT License",
        "js-yaml.LICENSE": "MIT License",
        "redoc.LICENSE": "The MIT License",
        "swagger-ui.LICENSE": "Apache License",
        "swagger-ui.NOTICE": "SmartBear",
    }
    for licence, text in licences.items():
        assert text in (STATIC / "vendor" / licence).read_text(), licence
    listed = {name for name, *_ in rows} | set(licences)
    listed |= {"README.md", "swagger-ui-bundle.js.LICENSE.txt", "redoc.standalone.js.LICENSE.txt"}
    assert {p.name for p in (STATIC / "vendor").iterdir()} == listed  # nothing unaccounted for


# What a browser would fetch from elsewhere: an element's source, a stylesheet's url() or
# @import, or any URL on a CDN's host (a link the user follows, `href`, is not a load).
LOADS_FROM_ELSEWHERE = re.compile(
    rb"""src\s*[:=]\s*["']https?://[^"']*|url\(\s*["']?https?://[^)"']*"""
    rb"""|@import\s+["']?https?://[^"';]*"""
    rb"""|https?://[\w.-]*(?:cdn|unpkg|jsdelivr|googleapis|gstatic)[\w.-]*/[^"'\s)]*"""
)


def test_no_static_file_loads_anything_from_elsewhere() -> None:
    """The service works offline. ReDoc 2.5.4's bundle rendered its footer logo from
    cdn.redoc.ly (`src:"https://cdn.redoc.ly/redoc/logo-mini.svg"`), refused by /redoc's
    policy in the browser but still a request to the internet in the code: the vendored bundle
    has that one image taken out (api/static/vendor/README.md says how)."""
    files = [p for p in STATIC.rglob("*") if p.suffix in {".html", ".js", ".css"}]
    assert {"redoc.standalone.js", "swagger-ui-bundle.js", "app.js", "index.html"} <= {
        p.name for p in files
    }
    found = {p.name: LOADS_FROM_ELSEWHERE.findall(p.read_bytes()) for p in files}
    assert {name: urls for name, urls in found.items() if urls} == {}
    # the pattern does find the logo in the bundle as published (its original text)
    assert LOADS_FROM_ELSEWHERE.findall(b'{alt:"redocly logo",src:"https://cdn.redoc.ly/x.svg"}')


def test_the_docs_pages_load_everything_from_this_server_without_a_key() -> None:
    swagger, redoc, schema = get(["/docs", "/redoc", "/openapi.json"])
    assert swagger.status_code == redoc.status_code == schema.status_code == 200
    for page in (swagger, redoc):
        assert page.headers["content-type"].startswith("text/html")
        targets = re.findall(r'(?:src|href|spec-url)="([^"]+)"', page.text)
        assert targets and all(t.startswith("/") for t in targets), targets
        assert not re.search(r"https?://", page.text), page.text
        policy = page.headers["content-security-policy"]
        assert policy.startswith("default-src 'self';") and "http" not in policy
    assert '<script src="/ui/vendor/swagger-ui-bundle.js"></script>' in swagger.text
    assert '"validatorUrl": null' in swagger.text  # no badge from validator.swagger.io
    assert '<script src="/ui/vendor/redoc.standalone.js"> </script>' in redoc.text
    assert '<redoc spec-url="/openapi.json"></redoc>' in redoc.text
    assert not {"/docs", "/redoc", "/docs/oauth2-redirect"} & set(schema.json()["paths"])
