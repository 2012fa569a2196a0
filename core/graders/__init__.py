"""Graders: score a completion against the record it answers, in [0, 1].

`core.config.graders` is the spec's schema (the API validates specs with it, and imports
this package too): so this package imports nothing heavy. math-verify, sympy and jsonschema are
imported inside the graders that use them, in the grading server, when they first grade.

- `build_grader(cfg)`: the grader a config declares (`Grader.score(completion, record)`);
- `BatchGrader`: what a task grades a step's batch with: isolation, deadlines, metrics;
- `GradingServer`: the child process that runs graders that can hang or crash;
- `load_python_graders`: a tenant's python graders loaded once, before a job trains;
- `GraderOptions`: what the operator lets OpenAI's python and score_model graders do.

Imports: `core.config` (the schema), `core.extras`, `core.process` (a server dies with its parent).
"""

from core.graders.base import Grader, GraderLoadError, Record, Scored
from core.graders.batch import BatchGrader, BatchGrades, load_python_graders
from core.graders.build import build_grader
from core.graders.options import GraderOptions, ModelEndpoint
from core.graders.plugins import ENTRY_POINT_GROUP, installed_plugins
from core.graders.server import GradingServer, Outcome, StartFailed

__all__ = [
    "ENTRY_POINT_GROUP",
    "BatchGrader",
    "BatchGrades",
    "Grader",
    "GraderLoadError",
    "GraderOptions",
    "GradingServer",
    "ModelEndpoint",
    "Outcome",
    "Record",
    "Scored",
    "StartFailed",
    "build_grader",
    "installed_plugins",
    "load_python_graders",
]
