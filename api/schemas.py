"""The JSON shapes of the HTTP API (responses); the request body is `pdppo.spec.JobSpec`.

These models are the contract the Python client and the CLI code against: every response of
`/v1/...` is one of them, and FastAPI publishes them in `/openapi.json`.

Errors are always `{"detail": "<message>"}` (`ErrorBody`); every 422 is `ValidationErrorBody`,
which adds `errors`, a list of `{"loc": [...], "msg": "...", "type": "..."}` (empty when the
request fit the schema and was refused after it), and whose `detail` names each field.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema

from pdppo.queues import QUEUE_PATTERN

JobStatus = Literal["queued", "running", "paused", "succeeded", "failed", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
EventType = Literal[
    "status", "metrics", "eval", "samples", "checkpoint", "log", "config", "phase", "done"
]
PhaseName = Literal["loading model", "warm-up", "training", "evaluating", "saving"]


class Progress(BaseModel):
    step: int = Field(description="last step whose metrics were published; 0 before the first")
    total: int = Field(description="steps the job will run (train.steps, as last changed)")


class JobPhase(BaseModel):
    """What a running job is doing now, so that a long silence (a model loading, a warm-up) has
    a name and, where it counts, a progress."""

    name: PhaseName = Field(
        description="loading model, warm-up, training, evaluating or saving (a checkpoint or "
        "the final model)"
    )
    done: int | None = Field(
        None, description="warm-up: steps done; training: the last published step"
    )
    total: int | None = Field(None, description="warm-up: its steps; training: the job's steps")


class JobWarning(BaseModel):
    """Something a job that succeeded should tell its user: it learned nothing, say."""

    code: str = Field(
        description=(
            "no_reward_variance (every group of every step scored alike: zero gradient), "
            "rewards_all_zero (the grader never matched), eval_unchanged (the held-out score "
            "never moved over 2+ evaluations)"
        )
    )
    message: str = Field(description="what happened and what to try")


class JobError(BaseModel):
    """Why a job failed, for the tenant: a code to branch on and a message to read.

    The worker's traceback is not here: it names the server's files and code, which are not the
    tenant's business. It stays in the worker's log and in the job's Redis record
    (`error_traceback`), for operators."""

    code: str = Field(
        description=(
            "e.g. training_error, invalid_input, out_of_memory, storage_full, storage_error, "
            "timeout, worker_lost (docs: Operators, Limits and failures)"
        )
    )
    message: str = Field(description="what happened, e.g. the exception's type and message")


class TrackerRun(BaseModel):
    """An experiment-tracker run the job reports to (`train.report_to`)."""

    run_id: str = Field(
        description="the tracker's run id (TensorBoard: the folder of its event files)"
    )
    url: str | None = Field(None, description="the run's page, where the tracker has one")


class Job(BaseModel):
    """A job as `POST /v1/jobs`, `GET /v1/jobs/{id}` and the routes that act on it return it."""

    id: str
    name: str | None = None
    status: JobStatus
    queue: str = Field(
        pattern=QUEUE_PATTERN,
        description=(
            "the worker queue it waits on: `cpu` or `gpu`, and `<device>.x<N>` for a job of N "
            "devices (resources.gpus), which only a worker that declared N or more takes"
        ),
    )
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = Field(None, description="first time a worker started it")
    finished_at: datetime | None = None
    spec: dict[str, Any] = Field(
        description=(
            "the JobSpec it runs with: as submitted (defaults filled in), with the changes "
            "made while it ran (`overrides`) applied"
        )
    )
    progress: Progress
    metrics: dict[str, float] | None = Field(None, description="metrics of the latest step")
    error: JobError | None = None
    cancel_requested: bool = False
    pause_requested: bool = Field(
        False, description="a pause is on its way: the job checkpoints and becomes `paused`"
    )
    config_version: int = Field(
        0, description="changes made while it ran (PATCH); its `config` events carry the number"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="every change made while it ran, as one JSON merge patch of the spec",
    )
    attempts: int = Field(0, description="times a worker started it (resumes count)")
    phase: JobPhase | None = Field(
        None, description="while running: what it is doing now; null otherwise"
    )
    warnings: list[JobWarning] = Field(
        default_factory=list,
        description="set when it ends: what it learned nothing from (it still succeeded)",
    )
    trackers: dict[str, TrackerRun] = Field(
        default_factory=dict,
        description=(
            "the experiment-tracker runs it reports to, by tracker (tensorboard, mlflow, "
            "wandb), each added once its run is open"
        ),
    )
    experiment: str | None = Field(
        None, description="the experiment it is a child of (`/v1/experiments/{id}`), if any"
    )


class JobList(BaseModel):
    """`GET /v1/jobs`: own jobs, newest first; pass `next_cursor` as `cursor` for the next page."""

    items: list[Job]
    next_cursor: str | None = None


class MetricsRow(BaseModel):
    step: int
    metrics: dict[str, float]


class MetricsHistory(BaseModel):
    """`GET /v1/jobs/{id}/metrics`: every published step in order (`?format=csv` for CSV)."""

    job_id: str
    items: list[MetricsRow]


class EvalRow(BaseModel):
    step: int = Field(description="the step after which the policy was evaluated")
    metrics: dict[str, float] = Field(
        description=(
            "eval_prompts, eval_reward_mean (sampled completions), eval_pass@k (with more than "
            "one sample per prompt; a pass is full credit), eval_greedy_reward_mean, "
            "eval_grader/<name>, eval_response_len, eval_time"
        )
    )


class EvalHistory(BaseModel):
    """`GET /v1/jobs/{id}/eval`: every held-out evaluation in step order (`?format=csv` for CSV);
    empty for a job without `train.eval_every`."""

    job_id: str
    items: list[EvalRow]


class Sample(BaseModel):
    """One prompt/completion/reward triple of a step's rollout; each text is at most 2000
    characters, fewer when many triples share an event (24000 in all), and `truncated` says
    that one was cut."""

    prompt: str = Field(description="the prompt text; chat turns as `role: content` lines")
    answer: str = Field(description="the record's reference answer, empty when it has none")
    completion: str
    reward: float
    truncated: bool


class SamplesRow(BaseModel):
    step: int
    samples: list[Sample]


class SamplesHistory(BaseModel):
    """`GET /v1/jobs/{id}/samples`: the newest samples rows (`limit`), newest last; empty for a
    job without `train.log_samples_every`."""

    job_id: str
    items: list[SamplesRow]


class Checkpoint(BaseModel):
    name: str = Field(description="e.g. step-000010")
    step: int
    size_bytes: int
    created_at: datetime
    download_url: str = Field(description="GET it for a .tar of the checkpoint folder")


class CheckpointList(BaseModel):
    """`GET /v1/jobs/{id}/checkpoints`, oldest first; `final_model_url` once the job succeeded."""

    job_id: str
    items: list[Checkpoint]
    final_model_url: str | None = Field(
        default=None,
        description=(
            "GET it for a .tar of the final/ folder. An hf: job's is a standard Hugging Face "
            "folder (transformers, vLLM; a LoRA job's adapter in PEFT's format in adapter/); "
            "a builtin:tiny job's is pdppo's own format, not a Hugging Face model (its "
            "README.md says how to load it). See docs/users/using-the-model.md."
        ),
    )


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    detail: str | None = None


# Server-sent events of `GET /v1/jobs/{id}/events` (`event:` name -> `data:` JSON):
#   status      {"status": JobStatus, "at": iso8601}
#   metrics     {"step": int, "total": int, "metrics": {name: float}}
#   eval        {"step": int, "total": int, "metrics": {name: float}}   (EvalRow.metrics)
#   samples     {"step": int, "samples": [Sample, ...]}
#   checkpoint  {"step": int, "name": "step-000010"}
#   log         {"message": str, "at": iso8601}
#   config      {"step": int, "version": int, "changes": {dotted path: value}}   (PATCH applied
#               from step + 1)
#   phase       {"name": PhaseName, "done": int | null, "total": int | null, "at": iso8601}
#   done        {"status": "succeeded" | "failed" | "cancelled"}
# `id:` is the Redis stream entry id ("1700000000000-0"); send it back as Last-Event-ID.


class ServerSentEvent(BaseModel):
    """One event of the stream as a client's SSE parser reads it; documented per event, the way
    OpenAPI 3.1 describes a `text/event-stream` body, so generated clients and Schemathesis can
    check each frame (ping comments are not events)."""

    event: EventType
    data: str = Field(
        description=(
            "JSON on one line: status {status, at}; metrics {step, total, metrics}; eval {step, "
            "total, metrics} (held-out evaluation); samples {step, samples: [{prompt, answer, "
            "completion, reward, truncated}]}; checkpoint {step, name}; log {message, at}; "
            "config {step, version, changes} (a change made with PATCH, applied from step + "
            "1); phase {name, done, total, at} (loading model, warm-up k of N, training, "
            "evaluating, saving); done {status}"
        )
    )
    id: str = Field(pattern=r"^[0-9]+-[0-9]+$", description="send back as Last-Event-ID")


class ErrorBody(BaseModel):
    """Every error but 422: `detail` says what is wrong, in words a person can act on."""

    detail: str


class StoreUnavailableBody(ErrorBody):
    """A 503 of a write the store may still carry out (`api.jobs.pending_writes`): which one."""

    # Absent rather than null when there is none (`SkipJsonSchema`: the schema says string).
    job_id: str | SkipJsonSchema[None] = Field(
        default=None, description="the job the unanswered write created or changed, maybe"
    )
    file_id: str | SkipJsonSchema[None] = Field(
        default=None, description="the file the unanswered write stored, maybe"
    )
    experiment_id: str | SkipJsonSchema[None] = Field(
        default=None, description="the experiment the unanswered write created, maybe"
    )


class VersionMismatchBody(ErrorBody):
    """A 412 of `PATCH /v1/jobs/{id}` (`api.jobs.preconditions`): the version the job is at."""

    config_version: int = Field(description="the job's config_version now (its ETag, unquoted)")


class ValidationErrorItem(BaseModel):
    """One bad part of a request, as FastAPI names it (`loc` starts with body, query, ...)."""

    loc: list[str | int] = Field(description='where, e.g. ["body", "train", "steps"]')
    msg: str
    type: str = Field(description="pydantic's error type, e.g. missing, int_type, json_invalid")


class ValidationErrorBody(BaseModel):
    """Every 422, whatever refused the request: `detail` names each problem in one string, and
    `errors` lists the schema's complaints field by field (empty when the request was well-formed
    but refused after the schema: a path outside the data roots, a job over its budget)."""

    detail: str
    errors: list[ValidationErrorItem]


class MemoryItem(BaseModel):
    name: str = Field(description="e.g. weights, optimizer, kv_cache, activations, logits")
    phase: Literal["persistent", "rollout", "update", "warmup", "checkpoint", "overhead"]
    bytes: int
    field: str = Field(description="the spec field that makes this item large")
    at_peak: bool = Field(description="counted in peak_memory_bytes")


class BudgetEstimate(BaseModel):
    """What a job will cost (`core.budget.Budget`); memory is on the job's device."""

    queue: Literal["cpu", "gpu"]
    device: Literal["cpu", "cuda"]
    model_source: str = Field(description="where the parameter count comes from")
    params: int | None = Field(description="all parameters; null when the API cannot see the model")
    trainable_params: int | None
    vocab_size: int | None
    prompt_tokens: int = Field(description="upper bound on one prompt's tokens")
    sequence_tokens: int = Field(description="prompt_tokens + rollout.max_new_tokens")
    sequences_per_step: int
    tokens_per_step: int
    steps: int
    total_tokens: int = Field(description="tokens_per_step * steps")
    peak_memory_bytes: int | None = Field(description="upper bound; null when params is null")
    peak_phases: list[str]
    fused_loss: bool = Field(
        description=(
            "the loss the trainer will run is fused (no [tokens, vocabulary] logits held): "
            "algorithm.fused_loss with the binary or topk estimator, top_p 1, and builtin:tiny "
            "or a Llama/Qwen hf: model whose output layer LoRA leaves alone"
        )
    )
    memory: list[MemoryItem]
    model_field: str
    tokens_field: str
    total_tokens_field: str
    notes: list[str]


class BudgetLimits(BaseModel):
    """The server's limits for the spec's queue (`PDPPO_MAX_*`); null: not checked."""

    queue: Literal["cpu", "gpu"]
    max_memory_bytes: int | None
    max_params: int | None
    max_tokens_per_step: int | None
    max_total_tokens: int | None


class SpecProblem(BaseModel):
    field: str = Field(description="the spec field most responsible, e.g. train.rollout.group_size")
    kind: Literal[
        "path",
        "file",
        "timeout",
        "devices",
        "engine",
        "grader",
        "task",
        "memory",
        "params",
        "tokens_per_step",
        "total_tokens",
    ]
    message: str = Field(description="what POST /v1/jobs would put in its 422 detail")
    estimate: int | None = None
    limit: int | None = None


class JobValidation(BaseModel):
    """`POST /v1/jobs:validate`: what the job would cost and whether `POST /v1/jobs` takes it."""

    ok: bool = Field(description="true when problems is empty")
    estimate: BudgetEstimate
    limits: BudgetLimits
    problems: list[SpecProblem]


class FileObject(BaseModel):
    """An uploaded dataset, as `POST /v1/files`, `GET /v1/files` and `GET /v1/files/{id}` return
    it. A job spec names it by `id` (`train.task.file`, `train.task.validation_file`)."""

    id: str = Field(
        pattern=r"^file-[0-9a-f]{32}$",
        description="`file-` and the first 32 hex digits of the content's sha256",
    )
    filename: str = Field(description="the name the upload gave the file (informational)")
    bytes: int = Field(description="size of the content")
    records: int = Field(description="JSONL records (non-blank lines), every one valid")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="of the whole content")
    created_at: datetime = Field(description="first upload of this content by this tenant")
    purpose: str | None = Field(
        None, description='the `purpose` field of the upload, e.g. "train" or "fine-tune"'
    )
    object: Literal["file"] = Field(
        default="file", description="as in OpenAI's file object (the `openai` SDK uploads here)"
    )
    status: Literal["processed"] = Field(
        default="processed", description="every line was checked before the answer"
    )


class FileList(BaseModel):
    """`GET /v1/files`: own files, newest first; pass `next_cursor` as `cursor` for more. The
    same page also in OpenAI's list shape (`data`, `has_more`, the last id as `after`), which
    the `openai` SDK reads: one answer for both kinds of client (see `api.routes.files`)."""

    items: list[FileObject]
    next_cursor: str | None = None
    object: Literal["list"] = Field(default="list", description="as in OpenAI's list object")
    data: list[FileObject] = Field(description="`items` again, for OpenAI's clients")
    has_more: bool = Field(description="more files follow (`next_cursor` is set)")
    first_id: str | None = Field(description="the page's first file, null when it is empty")
    last_id: str | None = Field(
        description="the page's last file (`after` for the next page), null when it is empty"
    )


class FileDeleted(BaseModel):
    """`DELETE /v1/files/{id}`: OpenAI's deletion object (pdppo's client reads no body)."""

    id: str = Field(pattern=r"^file-[0-9a-f]{32}$")
    object: Literal["file"] = "file"
    deleted: Literal[True] = True


class JobCounts(BaseModel):
    """A tenant's jobs by status (deleted jobs are not counted)."""

    queued: int
    running: int
    paused: int
    succeeded: int
    failed: int
    cancelled: int


class StorageBytes(BaseModel):
    """Bytes on disk, each file counted once however many jobs link to it."""

    files: int = Field(description="uploaded files")
    artifacts: int = Field(
        description="job folders: checkpoints, final models, logs, and uploads only jobs still hold"
    )
    total: int = Field(description="files plus artifacts: what the quota counts")


class Usage(BaseModel):
    """`GET /v1/usage`: what the caller's tenant keeps, and its storage quota."""

    tenant: str
    jobs: JobCounts
    files: int = Field(description="uploaded files kept")
    bytes: StorageBytes
    quota_bytes: int | None = Field(
        description=(
            "PDPPO_MAX_STORAGE_BYTES_PER_TENANT: past it, uploads and job submissions get 507; "
            "null: no quota"
        )
    )
    measured_at: datetime = Field(description="when `bytes` was measured: now")
