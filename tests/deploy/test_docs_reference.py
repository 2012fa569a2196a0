"""The generated reference pages (docs/hooks.py) say all that the schema and the settings say.

These need no MkDocs: they call the hook's renderers on the real app's schema and the real
`Settings`, so README's test command checks them on every run; tests/docs builds the site.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from api.app import create_app
from pdppo.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    settings = Settings(redis_url="redis://127.0.0.1:1/0", _env_file=None)  # type: ignore[call-arg]
    return create_app(settings).openapi()


def _sections(page: str) -> dict[str, str]:
    parts = re.split(r"^## `(\w+ \S+)`\n", page, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_operation_and_every_status_it_answers_is_on_the_page(
    schema: dict[str, Any],
) -> None:
    sections = _sections(_hooks().render_http_api(schema))
    expected = {
        f"{method.upper()} {path}": sorted(op["responses"])
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
    }
    assert sorted(sections) == sorted(expected)
    assert len(expected) >= 20 and "POST /v1/files" in expected
    for operation, statuses in expected.items():
        rows = re.findall(r"^\| (\d{3}) \|", sections[operation], re.MULTILINE)
        assert rows == statuses, operation
    # what a client most needs from one operation: its parameters, bounds and models
    listing = sections["GET /v1/jobs"]
    assert "| `limit` | query | integer (>= 1, <= 100, default `20`) | no | page size |" in listing
    assert "| 200 | Successful Response | `application/json` [JobList](#model-joblist) |" in listing
    assert "headers `Pdppo-Job-Id`, `Retry-After`" in sections["POST /v1/jobs"]
    both = "[ErrorBody](#model-errorbody) and [OpenAIErrorBody](#model-openaierrorbody) |"
    conflict = re.search(r"^\| 409 \|.*$", sections["DELETE /v1/files/{file_id}"], re.MULTILINE)
    assert conflict is not None and conflict.group(0).endswith(both), conflict


def test_every_model_is_on_the_page_with_its_fields(schema: dict[str, Any]) -> None:
    page = _hooks().render_http_api(schema)
    models = schema["components"]["schemas"]
    anchors = set(re.findall(r"\{ #(model-[a-z0-9]+) \}", page))
    assert anchors == {f"model-{name.lower()}" for name in models}
    linked = set(re.findall(r"\]\(#(model-[a-z0-9]+)\)", page))
    assert linked and linked <= anchors
    for field, sub in models["Job"]["properties"].items():
        assert f"| `{field}` |" in page, field
        if sub.get("description"):
            assert " ".join(sub["description"].split()).replace("|", "\\|") in page


def test_every_setting_is_a_row_with_its_default_and_description() -> None:
    page = _hooks().render_settings(Settings)
    rows = dict(re.findall(r"^\| `(PDPPO_[A-Z_]+)` \| (.*) \|$", page, re.MULTILINE))
    assert sorted(rows) == sorted(f"PDPPO_{name.upper()}" for name in Settings.model_fields)
    assert rows["PDPPO_MAX_WORKER_LOSSES"] == (
        "int | `3` | a job whose worker died more often than this fails (0: retry forever)"
    )
    assert rows["PDPPO_ROLLOUT_ENGINES"].split(" | ")[1] == "(computed)"


def _cells(row: str) -> int:
    """Cells of a Markdown table row: `|`s not escaped by an odd run of backslashes, less one."""
    return sum(1 for m in re.finditer(r"(\\*)\|", row) if len(m.group(1)) % 2 == 0) - 1


def test_every_table_row_has_as_many_cells_as_its_header(schema: dict[str, Any]) -> None:
    """A `|` in a description or a type (`int | None`, an enum) must not split its cell."""
    hooks = _hooks()
    for page in (hooks.render_http_api(schema), hooks.render_settings(Settings)):
        width = 0
        for line in page.splitlines():
            if not line.startswith("|"):
                width = 0
            elif width == 0:
                width = _cells(line)
            else:
                assert _cells(line) == width, line
    assert _cells(r"| `int \| None` | a \\| b |") == 3


def test_the_schema_is_the_codes_whatever_pdppo_variables_this_shell_has(
    schema: dict[str, Any],
) -> None:
    """`PDPPO_ENVIRONMENT=production` without keys makes the settings refuse: not the docs'."""
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('h', 'docs/hooks.py')\n"
        "hooks = importlib.util.module_from_spec(spec); spec.loader.exec_module(hooks)\n"
        "print(len(hooks._schema()['paths']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PDPPO_ENVIRONMENT": "production"}
    env.pop("PDPPO_API_KEYS", None)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout) == len(schema["paths"])
