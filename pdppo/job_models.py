"""`model.name: job:<id>`: a job that starts from the final model of one of the tenant's own
earlier jobs.

Where that model is: the earlier job's worker trained into `<artifact_dir>/<id>` (its out_dir,
`workers.job.runner.job_dir`) and `core.training.trainer.train` saved the final model into `final/`
there, in its family's own format (`builtin:tiny`'s safetensors and config.json, or
`save_pretrained`). The API and every worker mount the same artifact store
(`deploy/docker-compose.yml`: the `artifacts` volume at /artifacts), so both find it by the job id
alone; the `final_model` path in the job record is the earlier worker's view of it and is not used.

Who may use it: the same rule, checked twice with the same words. The API checks at submit (a
422 naming `train.model.name`), the worker again before it loads the model (the record may have
changed since, and a worker trusts no spec with another tenant's model). A missing job and
another tenant's job get the same answer, so that ids cannot be probed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pdppo.store import JobRecord

FIELD = "train.model.name"


class JobModelError(ValueError):
    """`model.name: job:<id>` names no model this job may start from; the message says why."""


def source_job_id(model_name: str) -> str | None:
    """The earlier job's id of a `job:<id>` model name (the spec checked its characters:
    letters, digits, '-' and '_', so it is a safe path component); None for other names."""
    return model_name.removeprefix("job:") if model_name.startswith("job:") else None


def final_model_dir(artifact_dir: Path, job_id: str) -> Path:
    """Where job `job_id`'s final model lies in the artifact store."""
    return artifact_dir / job_id / "final"


def job_model_problem(model_name: str, record: JobRecord | None, tenant: str) -> str | None:
    """Why `tenant` may not start from `model_name` (`job:<id>`) given that job's record; None
    when it may: the tenant's own job, succeeded, with a final model."""
    source = source_job_id(model_name)
    if source is None:
        return None
    if record is None or record.tenant != tenant:
        return f"{FIELD}: {model_name!r} names no job of yours (no job {source!r})"
    if record.status != "succeeded" or not record.final_model:
        return (
            f"{FIELD}: job {source!r} has no final model (it is {record.status}); "
            "start from a job that succeeded"
        )
    return None


def resolve_job_model(
    model_name: str,
    tenant: str,
    artifact_dir: Path,
    lookup: Callable[[str], JobRecord | None],
) -> Path | None:
    """The final-model folder `model_name` stands for (None for names other than `job:<id>`),
    for a job of `tenant`; `lookup` reads a job record. JobModelError when it may not be used
    or is not on this machine's artifact store."""
    source = source_job_id(model_name)
    if source is None:
        return None
    problem = job_model_problem(model_name, lookup(source), tenant)
    if problem is not None:
        raise JobModelError(problem)
    folder = final_model_dir(artifact_dir, source)
    if not folder.is_dir():
        raise JobModelError(
            f"{FIELD}: the final model of job {source!r} is not in the artifact store "
            f"({folder}); it was deleted, or this worker does not share the store"
        )
    return folder
