"""`/v1/fine_tuning/alpha/graders/...`: a grader built and run as a job would, for one sample.

A grader that holds a tenant's python runs in a grading server of its own (`core.graders.
GradingServer`), never in this process: the API compiles the code to refuse a syntax error and
leaves running it to a child it can kill. A top level that raises, exits or does not finish
loading in PDPPO_OPENAI_PYTHON_LOAD_SECONDS is the request's fault: a 400 naming the grader, as
fast as the child finds it. Every other grader runs in a thread here: string checks,
similarities of bounded texts, and a score model's one call under its endpoint's timeout.

Runs are admitted per tenant and per API process (`api.http.tenant_slots`, as event streams
are): each holds a thread, and a python grader's a process, for up to its deadline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any

import anyio
from fastapi import Depends, HTTPException, Request

from api.http.tenant_slots import LimitReached, Slot, TenantSlots
from api.openai.schemas import GraderRunErrors
from api.openai.translate import Refused
from core.config.graders import OpenAIGrader
from core.config.openai_graders import OpenAIGraderConfig
from core.config.task import TaskConfig
from core.graders import GraderLoadError, GraderOptions, GradingServer, StartFailed
from core.graders.base import Grader
from core.graders.hosted import EndpointError, NoScore, holds_python
from core.graders.openai import build_openai, refusals
from pdppo.settings import Settings

RUN_TIMEOUT_SECONDS: float = TaskConfig.model_fields["grader_timeout_seconds"].default
"""A python grader's deadline here: a job's default (`task.grader_timeout_seconds`)."""


RUN_RETRY_AFTER_SECONDS = (1, 5)
"""A refused run's Retry-After, drawn per answer: a run takes a second or so, at most its
deadline."""


def grader_runs(settings: Settings) -> TenantSlots:
    """The API process's admission of graders.run calls (`app.state.grader_runs`)."""
    return TenantSlots(
        settings.grader_runs_max, settings.grader_runs_max_per_tenant, RUN_RETRY_AFTER_SECONDS
    )


async def get_grader_runs(request: Request) -> TenantSlots:
    runs: TenantSlots = request.app.state.grader_runs
    return runs


GraderRunsDep = Annotated[TenantSlots, Depends(get_grader_runs)]


def admit_run(runs: TenantSlots, tenant: str) -> Slot:
    """A place for one more run of `tenant`'s, or a 429 saying whose limit is full."""
    try:
        return runs.admit(tenant)
    except LimitReached as exc:
        whose, setting = (
            (f"tenant {tenant!r} has", "PDPPO_GRADER_RUNS_MAX_PER_TENANT")
            if exc.limit == "tenant"
            else ("this server has", "PDPPO_GRADER_RUNS_MAX")
        )
        raise HTTPException(
            429,
            detail=f"{whose} {exc.value} grader runs in flight, the most allowed ({setting}); "
            "try again after Retry-After seconds",
            headers={"Retry-After": str(exc.retry_after)},
        ) from None


def grader_for(config: OpenAIGraderConfig, options: GraderOptions) -> Grader:
    """The grader, or a 400 naming what this service cannot run (`options`: the operator's)."""
    for where, problem in refusals(config, "grader", options):
        raise Refused(problem, where)
    try:
        return build_openai(config, "grader", options)  # a python grader is compiled, not run
    except ImportError as exc:  # a similarity library this API process lacks
        raise HTTPException(501, detail=str(exc)) from None
    except ValueError as exc:  # python that does not compile, or defines no grade()
        raise Refused(str(exc), "grader") from None


@dataclass
class RunResult:
    reward: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    errors: GraderRunErrors = field(default_factory=GraderRunErrors)
    message: str = ""


async def run_grader(
    config: OpenAIGraderConfig,
    grader: Grader,
    options: GraderOptions,
    sample: str,
    item: dict[str, Any],
) -> RunResult:
    """The grader's score for one sample and item, with OpenAI's error flags."""
    try:
        grader.check(item)
    except ValueError as exc:  # a template naming a field the item lacks
        return RunResult(errors=GraderRunErrors(invalid_variable_error=True), message=str(exc))
    if holds_python(config):
        return await anyio.to_thread.run_sync(_run_served, config, options, sample, item)
    try:
        scored = await anyio.to_thread.run_sync(grader.grade, sample, item)
    except EndpointError as exc:
        errors = GraderRunErrors(
            model_grader_server_error=True, model_grader_server_error_details=str(exc)
        )
        return RunResult(errors=errors, message=str(exc))
    except NoScore as exc:
        return RunResult(errors=GraderRunErrors(model_grader_parse_error=True), message=str(exc))
    except ValueError as exc:
        return RunResult(errors=GraderRunErrors(invalid_variable_error=True), message=str(exc))
    except ArithmeticError as exc:  # calculate_output divided by zero, say
        return RunResult(errors=GraderRunErrors(formula_parse_error=True), message=str(exc))
    return RunResult(scored.value, dict(scored.parts))


def _run_served(
    config: OpenAIGraderConfig, options: GraderOptions, sample: str, item: dict[str, Any]
) -> RunResult:
    """In a grading server started for this one call: the tenant's code never runs here. A
    Refused (400) when its top level cannot load (`GraderLoadError`)."""
    cfg = OpenAIGrader(type="openai", grader=config)
    started = time.monotonic()
    with GradingServer(cfg, RUN_TIMEOUT_SECONDS, where="grader", options=options) as server:
        try:
            server.start()
        except GraderLoadError as exc:
            # the server names the grader as a job's spec would (`grader.grader`, inside
            # pdppo's `openai` grader); the request's field is `grader`
            where = exc.where.replace("grader.grader", "grader", 1)
            message = str(exc).replace(exc.where, where, 1)
            raise Refused(message, f"{where}.source") from None
        except StartFailed:
            pass  # not the tenant's: `grade` tries once more and tells it as a runtime error
        outcome = server.grade([(sample, item)])[0]
    if outcome.failure is None:
        return RunResult(outcome.value, dict(outcome.parts))
    message = outcome.message
    if outcome.failure == "timeout":
        message = f"{message} (ran {time.monotonic() - started:.1f} s)"
    errors = GraderRunErrors(
        python_grader_runtime_error=True, python_grader_runtime_error_details=message
    )
    return RunResult(errors=errors, message=message)
