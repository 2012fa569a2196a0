"""OpenAI's templates: `{{item.<path>}}` from the record (a string as it is, anything else as
JSON), `{{sample.output_text}}` the completion, `{{sample.output_json...}}` the completion parsed
as JSON. Shared by the graders that render them (`core.graders.openai`, `core.graders.hosted`)."""

from __future__ import annotations

import json
from typing import Any

from core.config.openai_graders import TEMPLATE_RE
from core.graders.base import Record


class NotJson(ValueError):
    """The completion is not the JSON a template reads: the answer is wrong, it scores 0."""


def lookup(value: Any, keys: list[str], where: str) -> Any:
    """`value[k1][k2]...`; KeyError(`where`) when a key is missing."""
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise KeyError(where)
        value = value[key]
    return value


def text(value: Any) -> str:
    """A string as it is, anything else as JSON (what a template substitutes)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render(template: str, completion: str, record: Record) -> str:
    """`template` with each `{{...}}` replaced; KeyError naming a record path that is missing,
    NotJson when the completion is not the JSON that `sample.output_json` reads."""

    def value(path: str) -> str:
        namespace, *keys = path.split(".")
        if namespace == "item":
            return text(lookup(dict(record), keys, path))
        if keys == ["output_text"]:
            return completion
        try:
            parsed = json.loads(completion)
        except ValueError:
            raise NotJson(f"the completion is not JSON, which {{{{{path}}}}} reads") from None
        try:
            return text(lookup(parsed, keys[1:], path))
        except KeyError:
            raise NotJson(f"the completion's JSON has no {'.'.join(keys[1:])}") from None

    return TEMPLATE_RE.sub(lambda m: value(m.group(1)), template)


def check_paths(item_paths: list[str], record: Record) -> None:
    """A ValueError naming the first `item.<path>` of `item_paths` that `record` lacks (a
    grader's load-time `check`)."""
    for path in item_paths:
        try:
            lookup(dict(record), path.split(".")[1:], path)
        except KeyError:
            raise ValueError(
                f"the record has no {path.removeprefix('item.')!r}, which the grader's "
                f"template {{{{{path}}}}} reads"
            ) from None
