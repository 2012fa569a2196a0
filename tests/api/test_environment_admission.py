"""A multi-turn environment job at submission (the real app in-process, a real redis-server):
an environment the workers do not have, or arguments it refuses, is a 422 naming the field,
before anything is queued; so is a model without a chat template (builtin:tiny)."""

from __future__ import annotations

from typing import Any

from tests.support.inprocess import call


def _spec(
    environment: dict[str, Any], model: str = "hf:Qwen/Qwen2.5-0.5B-Instruct"
) -> dict[str, Any]:
    return {
        "train": {
            "model": {"name": model},
            "task": {"name": "environment", "environment": environment},
            "steps": 1,
        }
    }


def test_an_unknown_environment_or_bad_args_is_422_at_submission(settings: Any) -> None:
    tiny = _spec({"name": "calculator"}, model="builtin:tiny")
    unknown, bad_args, no_template = call(
        settings,
        ("alice", "/v1/jobs", {"json": _spec({"name": "calculatr"})}),
        ("alice", "/v1/jobs", {"json": _spec({"name": "calculator", "args": {"colour": 1}})}),
        ("alice", "/v1/jobs", {"json": tiny}),
    )
    assert unknown.status_code == 422
    assert unknown.json()["detail"].startswith(  # tests may register more after it
        "task.environment.name='calculatr' is not an environment here (known: calculator"
    )
    assert bad_args.status_code == 422
    assert "calculator has no colour (its args: min_value" in bad_args.json()["detail"]
    assert no_template.status_code == 422
    assert "needs a model with a chat template" in no_template.text
