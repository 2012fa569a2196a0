"""Admission: every reason the API refuses a job spec, shared by `POST /v1/jobs`,
`POST /v1/jobs:validate` and `PATCH /v1/jobs/{id}` (a steered spec is admitted again).

Beyond the spec's schema (FastAPI, from `JobSpec`): the local paths it names (`api.storage.paths`),
the uploaded files and earlier job's model it names (the tenant's own only), the server's timeout,
device and rollout-engine limits, a reasoning-gym task's config values (where this process has
the `reasoning` extra: `task_problems`), and its budget (`core.budget`: memory, parameters and
tokens against the queue's `PDPPO_MAX_*` limits), so that one spec cannot take a shared worker
down.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from api.schemas import SpecProblem
from api.storage.paths import forbidden_paths
from core.budget import Budget, Limits, check, estimate
from core.config import TaskConfig
from core.config.graders import OpenAIGrader
from core.extras import missing
from core.graders.openai import refusals
from pdppo.files import spec_file_ids
from pdppo.job_models import FIELD as JOB_MODEL_FIELD
from pdppo.job_models import final_model_dir, job_model_problem, source_job_id
from pdppo.settings import Settings
from pdppo.spec import JobSpec
from pdppo.store import AsyncFileStore, AsyncJobStore


def admission(
    spec: JobSpec, settings: Settings, model_dir: Path | None = None
) -> tuple[Budget, Limits, list[SpecProblem]]:
    """The spec's budget on its queue and every reason `POST /v1/jobs` would refuse it.

    A spec whose paths are refused is estimated without reading any file: the API must not
    open what the tenant may not read, not even a header. `model_dir`: the final model a
    `job:<id>` name stands for, once the job is known to be the tenant's own."""
    paths = forbidden_paths(spec, [str(r) for r in settings.allowed_data_roots])
    queue = spec.resources.device
    budget = estimate(
        spec.train,
        queue=queue,
        read_files=not paths,
        data_roots=[str(r) for r in settings.allowed_data_roots],
        model_dir=model_dir,
        devices=spec.resources.gpus,
    )
    limits = settings.budget_limits(queue)
    problems = [SpecProblem(field=p.split(":", 1)[0], kind="path", message=p) for p in paths]
    timeout = spec.resources.timeout_minutes
    if timeout is not None and timeout > settings.max_job_timeout_minutes:
        problems.append(
            SpecProblem(
                field="resources.timeout_minutes",
                kind="timeout",
                message=(
                    f"resources.timeout_minutes: {timeout:g} is more than this server's "
                    f"maximum of {settings.max_job_timeout_minutes:g} minutes"
                ),
            )
        )
    gpus = spec.resources.gpus
    if gpus > settings.max_job_devices:
        problems.append(
            SpecProblem(
                field="resources.gpus",
                kind="devices",
                message=(
                    f"resources.gpus: {gpus} is more devices than this server's workers give a "
                    f"job (PDPPO_MAX_JOB_DEVICES={settings.max_job_devices})"
                ),
            )
        )
    engine = spec.train.rollout.engine
    if engine not in settings.rollout_engines:
        problems.append(
            SpecProblem(
                field="train.rollout.engine",
                kind="engine",
                message=(
                    f"train.rollout.engine: {engine!r} is not offered by this server's workers "
                    f"(they offer {settings.rollout_engines}); vLLM rollouts need the `vllm` "
                    "extra (pip install 'pdppo[vllm]') in the workers, and the API told with "
                    "PDPPO_ROLLOUT_ENGINES"
                ),
            )
        )
    grader = spec.train.task.grader
    if isinstance(grader, OpenAIGrader):  # graders the workers would refuse to build
        problems += [
            SpecProblem(field=where, kind="grader", message=why)
            for where, why in refusals(
                grader.grader, "train.task.grader.grader", settings.grader_options()
            )
        ]
    problems += task_problems(spec.train.task)
    problems += [
        SpecProblem(field=p.field, kind=p.kind, message=str(p), estimate=p.estimate, limit=p.limit)
        for p in check(budget, limits)
    ]
    return budget, limits, problems


def task_problems(task: TaskConfig) -> list[SpecProblem]:
    """What a reasoning-gym dataset's own config class refuses (a range, fields that disagree),
    which the schema cannot know: checked here when this process has the `reasoning` extra
    (the images install it), building each config without generating a row. Without it the
    schema's checks stand alone (names, keys, value types: `core.config.reasoning_gym`) and the
    worker refuses such a value when the job starts. The first import of reasoning-gym takes
    seconds: `admit` runs this in a worker thread."""
    if task.name == "environment":
        return _environment_problems(task)
    if task.name != "reasoning_gym" or missing(("reasoning_gym",)) is not None:
        return []
    from core.tasks.reasoning_gym import check_values

    try:
        check_values(task)
    except ValueError as e:
        message = str(e)
        return [
            SpecProblem(field="train." + message.split(":", 1)[0], kind="task", message=message)
        ]
    return []


def _environment_problems(task: TaskConfig) -> list[SpecProblem]:
    """An environment the workers do not have, or arguments it refuses, named at submit: the
    environment is built (pure Python, no torch: `core.environments`), no episode played."""
    from core.environments import make_environment

    env = task.environment
    assert env is not None  # TaskConfig's check
    try:
        make_environment(env.name, env.args)
    except (ValueError, TypeError) as e:
        return [SpecProblem(field="train.task.environment", kind="task", message=str(e))]
    return []


async def admit(
    spec: JobSpec, settings: Settings, tenant: str, store: AsyncJobStore
) -> tuple[Budget, Limits, list[SpecProblem]]:
    """`admission`, in a worker thread when it may read files (a local model's headers, a
    dataset's prompts, reasoning-gym's modules), so that a slow disk never stalls the event loop;
    and the uploaded files and the earlier job's model (`job:<id>`) the spec names, which must be
    the tenant's own."""
    task = spec.train.task
    model_dir, model_problems = await _job_model(spec, settings, tenant, store)
    reads = task.path or task.validation_path or task.name == "reasoning_gym"
    if spec.train.model.name.startswith("hf:") or reads or model_dir:
        budget, limits, problems = await anyio.to_thread.run_sync(
            admission, spec, settings, model_dir
        )
    else:
        budget, limits, problems = admission(spec, settings)
    problems = model_problems + problems
    return budget, limits, problems + await _missing_files(spec, tenant, store.files)


async def _job_model(
    spec: JobSpec, settings: Settings, tenant: str, store: AsyncJobStore
) -> tuple[Path | None, list[SpecProblem]]:
    """For `model.name: job:<id>` (`pdppo.job_models`): that job's final-model folder, when it
    is the tenant's own job that succeeded and this API process sees its artifact store (the
    estimate reads it; a worker checks again), or the problem that refuses the spec."""
    name = spec.train.model.name
    source = source_job_id(name)
    if source is None:
        return None, []
    problem = job_model_problem(name, await store.get(source), tenant)
    if problem is not None:
        return None, [SpecProblem(field=JOB_MODEL_FIELD, kind="file", message=problem)]
    folder = final_model_dir(settings.artifact_dir, source)
    return (folder if await anyio.Path(folder).is_dir() else None), []


async def _missing_files(spec: JobSpec, tenant: str, files: AsyncFileStore) -> list[SpecProblem]:
    """A problem per file id of the spec that the tenant has not uploaded (or has deleted)."""
    named = spec_file_ids(spec.train.task)
    if not named:
        return []
    have = await files.existing(tenant, [file_id for _, file_id in named])
    return [
        SpecProblem(
            field=where,
            kind="file",
            message=f"{where}: file {file_id!r} not found; upload it first (POST /v1/files)",
        )
        for where, file_id in named
        if file_id not in have
    ]
