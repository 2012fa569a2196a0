"""Job spec files as the client reads them: YAML with YAML 1.2 numbers, relative paths made
absolute against the spec file's folder (as `pdppo train` does), or a mapping or model as is."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

SpecLike = Mapping[str, Any] | BaseModel | Path


class SpecFileError(ValueError):
    """A spec file that is not a YAML/JSON mapping (the file is named in the message)."""


# YAML 1.2 floats with an exponent that YAML 1.1 (PyYAML) reads as strings: 1e-5, 2E3, .5e-3
_YAML12_EXPONENT_FLOAT = re.compile(
    r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"
)


@functools.cache
def _spec_loader() -> type:
    import yaml

    class SpecLoader(yaml.SafeLoader):
        """SafeLoader (its resolvers are copied, not shared) that also reads 1e-5 as a float."""

    SpecLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float", _YAML12_EXPONENT_FLOAT, list("-+0123456789.")
    )
    return SpecLoader


def spec_yaml_load(text: str) -> Any:
    """YAML as a spec file means it: `lr: 1e-5` is a number (YAML 1.2), not the string that
    PyYAML's YAML 1.1 rules make of it (they want a dot and a signed exponent: `1.0e-5`). Specs
    are validated strictly (no string-to-number coercion), so the file must yield numbers."""
    import yaml

    return yaml.load(text, Loader=_spec_loader())


@functools.cache
def _spec_dumper() -> type:
    import yaml

    class SpecDumper(yaml.SafeDumper):
        """SafeDumper that quotes what SpecLoader reads as a float (the string "1e5")."""

    SpecDumper.add_implicit_resolver(
        "tag:yaml.org,2002:float", _YAML12_EXPONENT_FLOAT, list("-+0123456789.")
    )
    return SpecDumper


def spec_yaml_dump(data: Any) -> str:
    """`data` as a spec file that `spec_yaml_load` reads back as `data`. PyYAML's own dumper
    writes the string "1e5" bare, which YAML 1.1 reads as a string and a spec file (YAML 1.2
    numbers) as the number 100000."""
    import yaml

    text: str = yaml.dump(data, Dumper=_spec_dumper(), sort_keys=False, allow_unicode=True)
    return text


def _looks_like_path(value: str, base_dir: Path) -> bool:
    if value.startswith((".", "/", "~")):
        return True
    try:
        return (base_dir / value).exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def _absolute(value: str, base_dir: Path) -> str:
    """Absolute values are left as written (after `~` expansion); relative ones join the folder."""
    expanded = os.path.expanduser(value)
    if os.path.isabs(expanded):
        return expanded
    return os.path.normpath(os.path.join(base_dir, expanded))


def resolve_spec_paths(data: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """`data` with its relative local paths made absolute against `base_dir`, the folder of the
    spec file, so that `pdppo train` and `pdppo submit` read the same files whatever the
    current directory. `train.task.path` and `validation_path` are always paths (uploaded files,
    `task.file`, are ids and stay as they are); `hf:X` in `train.model.name` is a path
    when X starts with `.`, `/` or `~` or exists next to the spec file, and a hub id (left as is)
    otherwise. Values of the wrong type are left for validation to refuse."""
    train = data.get("train")
    if not isinstance(train, dict):
        return data
    train = dict(train)
    task = train.get("task")
    if isinstance(task, dict):
        for key in ("path", "validation_path"):
            if isinstance(task.get(key), str) and task[key]:
                task = {**task, key: _absolute(task[key], base_dir)}
        train["task"] = task
    model = train.get("model")
    if isinstance(model, dict) and isinstance(model.get("name"), str):
        name: str = model["name"]
        source = name.removeprefix("hf:")
        if name.startswith("hf:") and source and _looks_like_path(source, base_dir):
            train["model"] = {**model, "name": "hf:" + _absolute(source, base_dir)}
    return {**data, "train": train}


def _yaml_problem(exc: Exception) -> str:
    """`line 2, column 8: expected ',' or ']'`, not PyYAML's five-line report."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(exc).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def spec_to_dict(spec: SpecLike) -> dict[str, Any]:
    """Turns a spec given as a mapping, a pydantic model or a YAML/JSON file into JSON data.

    A file's relative dataset and model paths are resolved against the file's folder
    (`resolve_spec_paths`), as `pdppo train` does (`pdppo.spec.load_spec`)."""
    if isinstance(spec, Path):
        import yaml

        try:
            loaded = spec_yaml_load(spec.read_text())
        except yaml.YAMLError as exc:
            raise SpecFileError(f"{spec}: not valid YAML/JSON: {_yaml_problem(exc)}") from exc
        if not isinstance(loaded, dict):
            raise SpecFileError(
                f"{spec}: a job spec must be a mapping, got {type(loaded).__name__}"
            )
        return resolve_spec_paths(loaded, spec.absolute().parent)
    if isinstance(spec, BaseModel):
        dumped: dict[str, Any] = spec.model_dump(mode="json")
        return dumped
    return dict(spec)
