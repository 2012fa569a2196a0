"""Graders: score a completion against the record it answers, in [0, 1].

`core.config.graders` is the spec's schema (the API validates specs with it, and imports
this package too): so this package imports nothing heavy. math-verify, sympy and jsonschema are
imported inside the graders that use them, in the grading server, when they first grade.

- `build_grader(cfg)`: the grader a config declares (`Grader.score(completion, record)`);
- `BatchGrader`: what a task grades a step's batch with: isolation, deadlines, metrics;
- `GradingServer`: the child process that runs graders that can hang or crash.

Imports: `core.config` (the schema), `core.extras`, `core.process` (a server dies with its parent).
"""

from core.graders.base import Grader, Record, Scored
from core.graders.batch import BatchGrader, BatchGrades
from core.graders.build import build_grader
from core.graders.plugins import ENTRY_POINT_GROUP, installed_plugins
from core.graders.server import GradingServer, Outcome

__all__ = [
    "ENTRY_POINT_GROUP",
    "BatchGrader",
    "BatchGrades",
    "Grader",
    "GradingServer",
    "Outcome",
    "Record",
    "Scored",
    "build_grader",
    "installed_plugins",
]
