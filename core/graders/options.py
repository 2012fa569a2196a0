"""What the operator lets graders do beyond scoring text: run a tenant's python, call a model.

A spec cannot grant these: they are the service's choice (`pdppo.settings.graders`), passed down
from the worker to the task, its grading server and the graders. The defaults grant nothing, so a
caller that passes no options (a test, a library user, a worker of an older deployment) refuses
`python` and `score_model` graders rather than running them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PYTHON_SETTING = "PDPPO_OPENAI_PYTHON_GRADERS"
ENDPOINT_SETTING = "PDPPO_SCORE_MODEL_ENDPOINT"
LOAD_SETTING = "PDPPO_OPENAI_PYTHON_LOAD_SECONDS"
PYTHON_LOAD_SECONDS = 10.0
"""How long a python grader's top level (its imports, its tables) may run when a grading server
loads it, by default: a tenant's `import numpy` fits many times over, a loop without end is cut
here rather than by the server's minute-long start-up deadline (`core.graders.server`)."""


@dataclass(frozen=True)
class ModelEndpoint:
    """An OpenAI-compatible chat-completions API: `url` is its base (`http://host/v1`), the
    grader posts to `<url>/chat/completions`."""

    url: str
    api_key: str = ""
    timeout_seconds: float = 60.0

    def __repr__(self) -> str:  # the key stays out of logs and tracebacks
        return f"ModelEndpoint(url={self.url!r}, timeout_seconds={self.timeout_seconds:g})"


@dataclass(frozen=True)
class GraderOptions:
    """`python`: OpenAI `python` graders run (in the grading server); `score_model`: where
    OpenAI `score_model` graders send their prompts (None: refused); `python_load_seconds`: how
    long a python grader's top level may run when a grading server loads it."""

    python: bool = False
    score_model: ModelEndpoint | None = None
    python_load_seconds: float = PYTHON_LOAD_SECONDS

    def to_json(self) -> dict[str, Any]:
        """For the grading server's first line (the child rebuilds the options from it)."""
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any] | None) -> GraderOptions:
        if not obj:
            return cls()
        endpoint = obj.get("score_model")
        return cls(
            python=bool(obj.get("python", False)),
            score_model=ModelEndpoint(**endpoint) if endpoint else None,
            python_load_seconds=float(obj.get("python_load_seconds", PYTHON_LOAD_SECONDS)),
        )
