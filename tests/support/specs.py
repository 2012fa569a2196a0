"""Job specs for the tests: `smoke_spec` (examples/smoke.yaml), `parked_spec` (one no test
worker takes), `jsonl_spec` (one of uploaded files), `records` to upload, and `write_spec`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pdppo.client import spec_yaml_dump
from tests.support.stack import REPO


def smoke_spec(**train_overrides: Any) -> dict[str, Any]:
    """examples/smoke.yaml as a dict, with `train` keys overridden (e.g. steps=200)."""
    import yaml

    spec: dict[str, Any] = yaml.safe_load((REPO / "examples" / "smoke.yaml").read_text())
    spec["train"].update(train_overrides)
    return spec


def records(n: int, tag: str = "") -> bytes:
    """`n` prompt/answer records the tiny model can read (digits, reversed)."""
    rows = []
    for i in range(n):
        digits = f"{(i * 37 + 11) % 1000:03d}"
        rows.append(json.dumps({"prompt": f"{tag}{digits}=", "answer": digits[::-1]}))
    return ("\n".join(rows) + "\n").encode()


def parked_spec(name: str = "parked") -> dict[str, Any]:
    """No GPU worker runs in the tests: a gpu job stays queued until cancelled."""
    spec = smoke_spec()
    spec["name"] = name
    spec["resources"] = {"device": "gpu"}
    return spec


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(spec_yaml_dump(spec))  # read back as written (`spec_yaml_load`)
    return path


def jsonl_spec(file: str, validation_file: str | None = None, **train: Any) -> dict[str, Any]:
    spec = smoke_spec(steps=3, checkpoint_every=0, **train)
    spec["name"] = "files"
    spec["train"]["task"] = {"name": "jsonl", "file": file}
    if validation_file is not None:
        spec["train"]["task"]["validation_file"] = validation_file
    return spec
