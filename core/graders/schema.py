"""The `json_schema` grader: the completion is JSON that a JSON schema accepts."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from core.config.graders import JsonSchemaGrader, schema_problem
from core.extras import require
from core.graders.base import Grader, Record, field_value

MAX_CACHED_VALIDATORS = 256
"""Validators kept per process, by schema text: a batch holds a few distinct schemas, each
answered by a group of completions."""


class JsonSchema(Grader):
    """1 when the stripped completion parses as JSON and validates, else 0.

    The schema's draft is the one its `$schema` names (2020-12 when unset). Formats (`"format":
    "email"`) are annotations only, as the JSON Schema spec's default says, and no remote `$ref`
    is ever fetched. A schema's `pattern` is a Python regex that can backtrack without bound, so
    this grader runs in the grading server. jsonschema is imported on first use."""

    def __init__(self, cfg: JsonSchemaGrader, where: str) -> None:
        require(f"{where} (json_schema)", "jsonschema", ("jsonschema",))
        self.field = cfg.field
        # a fixed schema is one: the config checked it (`schema_problem`), with jsonschema
        # installed, as it is here
        self.fixed = cfg.json_schema
        self._validators: OrderedDict[str, Any] = OrderedDict()

    def check(self, record: Record) -> None:
        if self.fixed is None:
            problem = schema_problem(field_value(record, self.field))
            if problem:
                raise ValueError(f"field {self.field!r} is not a valid JSON schema: {problem}")

    def score(self, completion: str, record: Record) -> float:
        schema = self.fixed if self.fixed is not None else field_value(record, self.field)
        try:
            instance = json.loads(completion.strip())
        # a completion is the model's text: not JSON (or JSON nested past the parser's
        # recursion) is a wrong answer, not a grader failure
        except (ValueError, RecursionError):
            return 0.0
        return float(self._validator(schema).is_valid(instance))

    def _validator(self, schema: Any) -> Any:
        key = json.dumps(schema, sort_keys=True)
        validator = self._validators.get(key)
        if validator is None:
            from jsonschema.validators import validator_for

            validator = validator_for(schema)(schema)
            self._validators[key] = validator
            if len(self._validators) > MAX_CACHED_VALIDATORS:
                self._validators.popitem(last=False)
        else:
            self._validators.move_to_end(key)
        return validator
