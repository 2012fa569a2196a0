"""OpenAI's objects to pdppo's and back: a create request to a job spec, a job record to a
`fine_tuning.job`, an event stream entry to a `fine_tuning.job.event`.

The mapping of a reinforcement create (README's table, "Coming from OpenAI's fine-tuning API"):

| OpenAI | pdppo job spec |
|---|---|
| `model` | `train.model.name` (builtin:, hf: under the data roots, job:<id>) |
| `training_file`, `validation_file` | `train.task.file`, `.validation_file` (task `jsonl`) |
| `seed` | `train.seed` |
| `suffix` | `name` |
| `method.reinforcement.grader` | `train.task.grader: {type: openai, grader}` |
| `batch_size` | `train.rollout.prompts_per_step` |
| `n_epochs` (auto: 1) | `train.steps` = ceil(n_epochs * records / prompts_per_step) |
| `learning_rate_multiplier` | `train.optim.lr` = the model's default rate * multiplier |
| `compute_multiplier` | `train.rollout.group_size` = round(8 * multiplier), at least 2 |
| `eval_interval` (auto: the last step, with a validation file) | `train.eval_every` |
| `eval_samples` | `train.eval_samples` |
| `pdppo` (extension) | merged over all of the above |

A reasoning-gym task (`pdppo: {train: {task: {name: reasoning_gym, dataset: ...}}}`) generates its
rows and scores them with the dataset's own `score_answer`: its create names no `training_file`,
`validation_file` or grader, and `n_epochs` counts its `task.size` rows (1000 by default); the
held-out rows are evaluated at the last step unless `eval_interval` says otherwise.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from api.openai.schemas import (
    FineTuningJob,
    FineTuningJobCreate,
    FineTuningJobError,
    FineTuningJobEvent,
    FineTuningJobExtension,
    Hyperparameters,
)
from core.config.reasoning_gym import DEFAULT_SIZE
from core.training.steering import merge_patch
from pdppo.spec import JobSpec
from pdppo.store import JobRecord

JOB_PREFIX = "ftjob-"
EVENT_PREFIX = "ftevent-"
DEFAULT_GROUP_SIZE = 8
"""`train.rollout.group_size`'s default, which `compute_multiplier` scales."""


class Refused(ValueError):
    """A create request pdppo cannot run: a 400 whose `param` names the request field."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def job_id_of(openai_id: str) -> str:
    """The native id in `ftjob-<id>`; an id without the prefix is taken as native (the SDK
    passes what it was given)."""
    return openai_id.removeprefix(JOB_PREFIX)


def _set(target: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value


def _given(value: Any) -> bool:
    return value is not None and value != "auto"


def _param(loc: tuple[Any, ...]) -> str:
    """The request field a spec field came from, for an error's `param`."""
    path = ".".join(str(p) for p in loc)
    if path in ("train.model", "train.model.name"):  # the model's own check is at its level
        return "model"
    for spec_path, param in (
        ("train.task.grader.grader", "method.reinforcement.grader"),
        ("train.task.file", "training_file"),
        ("train.task.validation_file", "validation_file"),
        ("train.seed", "seed"),
        ("name", "suffix"),
    ):
        if path == spec_path or path.startswith(spec_path + "."):
            return param + path.removeprefix(spec_path)
    return f"pdppo.{path}"


def generates_rows(body: FineTuningJobCreate) -> bool:
    """Whether the create's pdppo extension names a reasoning_gym task: no training file then."""
    train = (body.pdppo or {}).get("train")
    task = train.get("task") if isinstance(train, dict) else None
    return isinstance(task, dict) and task.get("name") == "reasoning_gym"


def _task(body: FineTuningJobCreate) -> dict[str, Any]:
    """The task the OpenAI fields say: a JSONL file and its grader; nothing for a reasoning_gym
    task (the extension holds it all), which takes neither."""
    assert body.method is not None and body.method.reinforcement is not None
    grader = body.method.reinforcement.grader
    if generates_rows(body):
        given = {
            "training_file": body.training_file,
            "validation_file": body.validation_file,
            "method.reinforcement.grader": grader,
        }
        for param, value in given.items():
            if value is not None:
                raise Refused(
                    f"{param}: a reasoning_gym task (pdppo.train.task) generates its rows and "
                    "scores them with the dataset's score_answer; leave it out",
                    param,
                )
        return {}
    if body.training_file is None:
        raise Refused(
            "training_file: required (an uploaded file id), unless pdppo.train.task is a "
            "reasoning_gym task",
            "training_file",
        )
    if grader is None:
        raise Refused(
            "method.reinforcement.grader: required, unless pdppo.train.task is a reasoning_gym "
            "task",
            "method.reinforcement.grader",
        )
    task: dict[str, Any] = {
        "name": "jsonl",
        "file": body.training_file,
        "grader": {"type": "openai", "grader": grader.model_dump(mode="json", exclude_none=True)},
    }
    if body.validation_file is not None:
        task["validation_file"] = body.validation_file
    return task


def to_spec(
    body: FineTuningJobCreate, training_records: int | None
) -> tuple[JobSpec, dict[str, Any]]:
    """The job spec a reinforcement create asks for, and the hyperparameters it resolved to
    (what the job object shows); `Refused` for what pdppo does not train. `training_records`:
    the training file's records (None for a reasoning_gym task, which counts its task.size)."""
    method = body.method
    if method is None or method.type != "reinforcement" or method.reinforcement is None:
        kind = "supervised (the default)" if method is None else method.type
        raise Refused(
            f"pdppo trains with reinforcement only, not {kind}: set method.type to "
            "reinforcement with method.reinforcement.grader",
            "method.type" if method is not None else "method",
        )
    if body.hyperparameters:
        raise Refused(
            "hyperparameters at the top level are for supervised jobs; give them in "
            "method.reinforcement.hyperparameters",
            "hyperparameters",
        )
    if body.integrations:
        raise Refused("integrations are not supported by pdppo", "integrations")
    hp = method.reinforcement.hyperparameters
    train: dict[str, Any] = {"model": {"name": body.model}, "task": _task(body)}
    if body.seed is not None:
        train["seed"] = body.seed
    spec: dict[str, Any] = {"train": train}
    if body.suffix is not None:
        spec["name"] = body.suffix
    if hp is not None:
        if _given(hp.batch_size):
            _set(train, "rollout.prompts_per_step", hp.batch_size)
        if _given(hp.compute_multiplier):
            assert isinstance(hp.compute_multiplier, float | int)
            group = max(2, round(DEFAULT_GROUP_SIZE * hp.compute_multiplier))
            _set(train, "rollout.group_size", group)
        if _given(hp.eval_interval):
            train["eval_every"] = hp.eval_interval
        if _given(hp.eval_samples):
            train["eval_samples"] = hp.eval_samples
    extension = body.pdppo or {}
    merged = merge_patch(spec, extension)
    own = extension.get("train", {}) if isinstance(extension.get("train"), dict) else {}
    epochs = hp.n_epochs if hp is not None and isinstance(hp.n_epochs, int) else 1
    validated = _validated(merged)
    per_step = validated.train.rollout.prompts_per_step
    task = validated.train.task
    held_out = body.validation_file is not None
    if task.name == "reasoning_gym":
        training_records = task.size if task.size is not None else DEFAULT_SIZE
        held_out = task.validation_size != 0
    assert training_records is not None  # a JSONL task names its file (`_task`)
    if "steps" not in own:
        merged["train"]["steps"] = max(1, math.ceil(epochs * training_records / per_step))
    if "eval_every" not in own and held_out and not (hp is not None and _given(hp.eval_interval)):
        merged["train"]["eval_every"] = merged["train"].get("steps", validated.train.steps)
    multiplier = hp.learning_rate_multiplier if hp is not None else None
    if _given(multiplier) and "lr" not in own.get("optim", {}):
        assert isinstance(multiplier, float | int) and validated.train.optim.lr is not None
        _set(merged["train"], "optim.lr", validated.train.optim.lr * multiplier)
    final = _validated(merged)
    assert final.train.optim.lr is not None and validated.train.optim.lr is not None
    resolved = {
        "batch_size": final.train.rollout.prompts_per_step,
        "n_epochs": epochs,
        "learning_rate_multiplier": final.train.optim.lr / validated.train.optim.lr,
    }
    return final, resolved


def _validated(spec: dict[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(spec)
    except ValidationError as e:
        first = e.errors()[0]
        where = _param(tuple(first["loc"]))
        message = first["msg"].removeprefix("Value error, ")
        raise Refused(f"{where}: {message}", where) from None


def problem_param(field: str) -> str:
    """`param` for an admission problem's spec field."""
    return _param(tuple(field.split(".")))


def _seconds(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp())


def _epoch(iso: str | None) -> int | None:
    return _seconds(iso) if iso else None


def to_openai_job(record: JobRecord) -> FineTuningJob:
    """The job as OpenAI shows it; a native job (no OpenAI request) shows what its spec says."""
    made = record.openai or {}
    request = made.get("request", {})
    spec = record.current_spec
    train = spec.get("train", {})
    task = train.get("task", {})
    grader = task.get("grader") or {}
    resolved = made.get("hyperparameters", {})
    hyperparameters = Hyperparameters(
        batch_size=train.get("rollout", {}).get("prompts_per_step"),
        n_epochs=resolved.get("n_epochs"),
        learning_rate_multiplier=resolved.get("learning_rate_multiplier"),
    )
    method = None
    if grader.get("type") == "openai":
        given = (request.get("method") or {}).get("reinforcement", {}).get("hyperparameters")
        method = {
            "type": "reinforcement",
            "reinforcement": {"grader": grader["grader"], "hyperparameters": given or {}},
        }
    error = None
    if record.error_code:
        error = FineTuningJobError(code=record.error_code, message=record.error_message or "")
    return FineTuningJob(
        id=JOB_PREFIX + record.id,
        created_at=_seconds(record.created_at),
        finished_at=_epoch(record.finished_at),
        error=error,
        fine_tuned_model=f"job:{record.id}" if record.status == "succeeded" else None,
        hyperparameters=hyperparameters,
        model=request.get("model") or train.get("model", {}).get("name", ""),
        organization_id=record.tenant,
        seed=int(train.get("seed", 0)),
        status=record.status,  # type: ignore[arg-type]
        training_file=task.get("file"),
        validation_file=task.get("validation_file"),
        metadata=request.get("metadata"),
        method=method,
        user_provided_suffix=request.get("suffix"),
        pdppo=FineTuningJobExtension(
            job_id=record.id,
            step=record.step,
            total_steps=record.total_steps,
            metrics=record.metrics,
        ),
    )


_STATUS_MESSAGES = {
    "queued": "Job queued",
    "running": "Job started",
    "paused": "Job paused",
    "succeeded": "Job succeeded",
    "failed": "Job failed",
    "cancelled": "Job cancelled",
}


def to_event(entry_id: str, fields: dict[str, str]) -> FineTuningJobEvent:
    """A stream entry as OpenAI's event: metrics and evaluations are `metrics` events whose
    data holds the step's numbers; everything else is a `message`."""
    kind = fields.get("type", "log")
    try:
        data = json.loads(fields.get("data") or "{}")
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {"value": data}
    created = int(entry_id.split("-", 1)[0]) // 1000
    level = "info"
    event_type = "message"
    if kind in ("metrics", "eval"):
        event_type = "metrics"
        step, total = data.get("step"), data.get("total")
        what = "evaluation" if kind == "eval" else "step"
        message = f"{what} {step}/{total}"
        data = {"step": step, "total_steps": total, **(data.get("metrics") or {})}
        if kind == "eval":
            data["eval"] = True
    elif kind == "status":
        status = str(data.get("status", ""))
        message = _STATUS_MESSAGES.get(status, f"Job {status}")
        level = "error" if status == "failed" else "info"
    elif kind == "done":
        message = f"The job has ended: {data.get('status', '')}"
    elif kind == "checkpoint":
        message = f"Checkpoint {data.get('name', '')} written at step {data.get('step')}"
    elif kind == "log":
        message = str(data.get("message", ""))
        level = "warn" if data.get("level") in ("warning", "warn") else "info"
    elif kind == "samples":
        message = f"{len(data.get('samples') or [])} samples of step {data.get('step')}"
    elif kind == "config":
        message = f"Settings changed from step {data.get('step', 0) + 1}: {data.get('changes')}"
    elif kind == "phase":
        message = f"Phase: {data.get('name', '')}"
    else:
        message = kind
    return FineTuningJobEvent(
        id=EVENT_PREFIX + entry_id,
        created_at=created,
        level=level,  # type: ignore[arg-type]
        message=message,
        type=event_type,  # type: ignore[arg-type]
        data={"pdppo_type": kind, **data},
    )
