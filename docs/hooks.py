"""MkDocs hook (mkdocs.yml `hooks:`): the reference pages that the code already says.

The HTTP API page is rendered from `create_app().openapi()`, the schema CI fuzzes the running API
against, and the settings page from `pdppo.settings.Settings`' fields, so neither is written a
second time by hand and neither can drift from the code. Both are added as generated files when
MkDocs collects the docs, before the nav is built: strict mode then checks their links and
anchors like any page's. Nothing here needs Redis or a network: building the schema only walks
the routes.

The module tables of developers/architecture.md are generated from the tree the same way: a
`<!-- modules: core -->` line becomes the table of `core`'s packages (`render_modules`), so a
module moved, added or removed is on the page at the next build with nothing to edit by hand.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HTTP_API_PAGE = "reference/http-api.md"
MODULES_MARKER = re.compile(r"^<!-- modules: ([a-z_]+) -->$", re.MULTILINE)
SETTINGS_PAGE = "operators/settings.md"
_METHODS = ("get", "post", "put", "patch", "delete")


def _cell(text: Any) -> str:
    """Table cells are one line and must not end the cell early."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _anchor(name: str) -> str:
    return "model-" + name.lower()


def _type(schema: dict[str, Any]) -> str:
    """A schema's type in words, with links to the models it names."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    for key, joint in (("anyOf", " or "), ("oneOf", " or "), ("allOf", " and ")):
        if key in schema:  # allOf: every part at once (an error of /v1/files: both shapes)
            return joint.join(_type(sub) for sub in schema[key])
    if "const" in schema:
        return f"`{schema['const']!r}`"
    if "enum" in schema:
        return " | ".join(f"`{value}`" for value in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of {_type(schema['additionalProperties'])}"
    if kind == "null":
        return "null"
    return str(kind)


def _bounds(schema: dict[str, Any]) -> str:
    words = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
    parts = [f"{sign} {schema[key]}" for key, sign in words.items() if key in schema]
    if "default" in schema:
        parts.append(f"default `{schema['default']!r}`")
    return ", ".join(parts)


def _operation(method: str, path: str, op: dict[str, Any]) -> list[str]:
    lines = [f"## `{method.upper()} {path}`", ""]
    if op.get("summary"):
        lines += [f"**{op['summary']}.**", ""]
    if op.get("description"):
        lines += [op["description"].strip(), ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in params:
            schema = p.get("schema", {})
            kind = _type(schema)
            if _bounds(schema):
                kind += f" ({_bounds(schema)})"
            required = "yes" if p.get("required") else "no"
            desc = p.get("description", "")
            lines.append(
                f"| `{p['name']}` | {p['in']} | {_cell(kind)} | {required} | {_cell(desc)} |"
            )
        lines.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines += [f"Request body (`{media}`): {_type(content.get('schema', {}))}", ""]
    lines += ["| status | meaning | body |", "|---|---|---|"]
    for status, response in sorted(op.get("responses", {}).items()):
        content = response.get("content", {})
        bodies = ", ".join(f"`{m}` {_type(c.get('schema', {}))}" for m, c in content.items())
        headers = ", ".join(f"`{h}`" for h in response.get("headers", {}))
        if headers:
            bodies = f"{bodies}; headers {headers}" if bodies else f"headers {headers}"
        lines.append(f"| {status} | {_cell(response.get('description', ''))} | {_cell(bodies)} |")
    return [*lines, ""]


def _model(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{ #{_anchor(name)} }}", ""]
    if schema.get("description"):
        lines += [schema["description"].strip(), ""]
    props = schema.get("properties", {})
    if props:
        required = set(schema.get("required", []))
        lines += ["| field | type | required | description |", "|---|---|---|---|"]
        for field, sub in props.items():
            kind = _type(sub)
            if _bounds(sub):
                kind += f" ({_bounds(sub)})"
            desc = sub.get("description", "")
            need = "yes" if field in required else "no"
            lines.append(f"| `{field}` | {_cell(kind)} | {need} | {_cell(desc)} |")
        lines.append("")
    elif "enum" in schema or "type" in schema:
        lines += [f"Type: {_type(schema)}", ""]
    return lines


def render_http_api(schema: dict[str, Any]) -> str:
    """The HTTP API reference as Markdown: every operation, every status it answers, every model."""
    info = schema.get("info", {})
    out = [
        "# HTTP API reference",
        "",
        f"Generated at build time from the API's OpenAPI schema ({info.get('title', '')} "
        f"{info.get('version', '')}, `/openapi.json` on a running server): every operation with "
        "every status it can answer and the model of each body. "
        "[HTTP API](../users/http-api.md) says how to use it, with examples.",
        "",
    ]
    for path, ops in schema.get("paths", {}).items():
        for method in _METHODS:
            if method in ops:
                out += _operation(method, path, ops[method])
    out += ["## Models", ""]
    for name, sub in sorted(schema.get("components", {}).get("schemas", {}).items()):
        out += _model(name, sub)
    return "\n".join(out).rstrip() + "\n"


def _default(field: Any) -> str:
    if field.default_factory is not None:
        return "(computed)"
    value = field.default
    if isinstance(value, Path):
        value = str(value)
    return f"`{value!r}`"


def render_settings(settings_class: Any) -> str:
    """The settings reference: one row per `PDPPO_*` variable, from the fields themselves."""
    out = [
        "# Settings",
        "",
        "The API, the Celery app and the workers read one settings object, `pdppo.settings."
        "Settings`, from `PDPPO_*` environment variables (and a `.env` file in the working "
        "folder): every field below is the variable `PDPPO_<FIELD IN CAPITALS>`. This page is "
        "generated from those fields at build time. "
        "[Deployment](deployment.md) says where compose sets them (`deploy/.env`).",
        "",
        "| variable | type | default | what it does |",
        "|---|---|---|---|",
    ]
    prefix = settings_class.model_config.get("env_prefix", "")
    for name, field in settings_class.model_fields.items():
        annotation = field.annotation
        kind = annotation.__name__ if isinstance(annotation, type) else str(annotation)
        kind = kind.replace("typing.", "").replace("pathlib.", "")
        variable = f"{prefix}{name}".upper()
        out.append(
            f"| `{variable}` | {_cell(kind)} | {_cell(_default(field))} | "
            f"{_cell(field.description or '')} |"
        )
    return "\n".join(out) + "\n"


def _schema() -> dict[str, Any]:
    """The app's schema as the code defines it, whatever this machine's `PDPPO_*` say.

    Importing the app builds the Celery app, which reads the settings from the environment; a
    shell with `PDPPO_ENVIRONMENT=production` and no keys would make that refuse, and the
    build fail for a reason that has nothing to do with the docs.
    """
    saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith("PDPPO_")}
    try:
        from api.app import create_app
        from pdppo.settings import Settings

        settings = Settings(redis_url="redis://127.0.0.1:1/0", _env_file=None)  # type: ignore[call-arg]
        return create_app(settings).openapi()
    finally:
        os.environ.update(saved)


def _summary(init: Path) -> str:
    """The first paragraph of a package's docstring: by the project's style, what it is for."""
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
    return _cell(doc.split("\n\n", 1)[0]) if doc else "(no docstring)"


def render_modules(root: Path, top: str) -> str:
    """The table of the package `top` under `root` and of every package inside it: its folder,
    what its docstring says it is for, its modules and its sub-packages, one row per package."""
    lines = ["| package | what it is for | modules |", "|---|---|---|"]
    for init in sorted((root / top).rglob("__init__.py")):
        folder = init.parent
        if any(part.startswith((".", "_")) for part in folder.relative_to(root).parts):
            continue  # __pycache__, hidden folders: not packages of the tree
        names = [f"`{p.stem}`" for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"]
        names += [
            f"`{d.name}/`"
            for d in sorted(folder.iterdir())
            if (d / "__init__.py").is_file() and not d.name.startswith((".", "_"))
        ]
        where = folder.relative_to(root).as_posix()
        lines.append(f"| `{where}/` | {_summary(init)} | {', '.join(names) or '-'} |")
    return "\n".join(lines)


def _source_root() -> Path:
    """Where the code is: the folder that holds the importable `core` package (this checkout's,
    or the one a copy of docs/ is built against, as tests/docs does)."""
    spec = importlib.util.find_spec("core")
    if spec is None or spec.origin is None:
        return ROOT
    return Path(spec.origin).resolve().parents[1]


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each `<!-- modules: TOP -->` line with `render_modules`' table of TOP."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    root = _source_root()
    return MODULES_MARKER.sub(lambda m: render_modules(root, m.group(1)), markdown)


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site, as if they were files under docs/."""
    from mkdocs.structure.files import File

    if str(ROOT) not in sys.path:  # a checkout without `pip install -e`
        sys.path.insert(0, str(ROOT))
    from pdppo.settings import Settings

    files.append(File.generated(config, HTTP_API_PAGE, content=render_http_api(_schema())))
    files.append(File.generated(config, SETTINGS_PAGE, content=render_settings(Settings)))
    return files
