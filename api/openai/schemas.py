"""OpenAI's fine-tuning objects, as the `openai` SDK sends and reads them; pdppo's additions are
named `pdppo` (an extension field, ignored by clients that do not know it)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.config.openai_graders import OpenAIGraderConfig

_STRICT = ConfigDict(extra="forbid")

Auto = Literal["auto"]
MetadataMap = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16),
]


class ErrorObject(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, ... server_error")
    param: str | None = Field(description="the request field at fault, when one is")
    code: str | None = Field(description="a machine-readable reason, when there is one")


class OpenAIErrorBody(BaseModel):
    """Every error on `/v1/fine_tuning/...`: OpenAI's error object."""

    error: ErrorObject


class ReinforcementHyperparameters(BaseModel):
    """Each `"auto"` (pdppo's default) or a value; how each maps onto the job spec is in
    `api.openai.translate`."""

    model_config = _STRICT

    batch_size: Auto | Annotated[int, Field(ge=1, le=4096)] | None = None
    n_epochs: Auto | Annotated[int, Field(ge=1, le=1000)] | None = None
    learning_rate_multiplier: Auto | Annotated[float, Field(gt=0, le=100)] | None = None
    eval_interval: Auto | Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    eval_samples: Auto | Annotated[int, Field(ge=1, le=64)] | None = None
    compute_multiplier: Auto | Annotated[float, Field(gt=0, le=64)] | None = None
    reasoning_effort: Literal["default", "low", "medium", "high"] | None = Field(
        default=None, description="accepted; pdppo's models have no reasoning effort to set"
    )


class ReinforcementMethod(BaseModel):
    model_config = _STRICT

    grader: OpenAIGraderConfig | None = Field(
        default=None,
        description=(
            "required, except for a reasoning_gym task (pdppo.train.task), which the dataset's "
            "own score_answer scores"
        ),
    )
    hyperparameters: ReinforcementHyperparameters | None = None


class Method(BaseModel):
    model_config = _STRICT

    type: Literal["reinforcement", "supervised", "dpo"]
    reinforcement: ReinforcementMethod | None = None
    supervised: dict[str, Any] | None = None
    dpo: dict[str, Any] | None = None


class FineTuningJobCreate(BaseModel):
    """`client.fine_tuning.jobs.create(...)`. Only `method.type: reinforcement` trains here."""

    model_config = _STRICT

    model: Annotated[str, Field(min_length=1, max_length=4096)] = Field(
        description=(
            "builtin:<name>, hf:<folder under the data roots>, or a fine_tuned_model of an "
            "earlier job (job:<id>)"
        )
    )
    training_file: Annotated[str, Field(pattern=r"^file-[0-9a-f]{32}$")] | None = Field(
        default=None,
        description=(
            "an uploaded file id (client.files.create); required, except for a reasoning_gym "
            "task (pdppo.train.task), which generates its rows"
        ),
    )
    validation_file: Annotated[str, Field(pattern=r"^file-[0-9a-f]{32}$")] | None = None
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    suffix: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    metadata: MetadataMap | None = None
    method: Method | None = None
    hyperparameters: dict[str, Any] | None = Field(
        default=None, description="deprecated by OpenAI; use method.reinforcement.hyperparameters"
    )
    integrations: list[dict[str, Any]] | None = None
    pdppo: dict[str, Any] | None = Field(
        default=None,
        description=(
            "pdppo's own knobs: a partial job spec ({train: {algorithm: {mask: dppo}}, "
            "resources: {...}}) merged over the translation; what it sets wins"
        ),
    )


class FineTuningJobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class Hyperparameters(BaseModel):
    batch_size: int | None = None
    n_epochs: int | None = None
    learning_rate_multiplier: float | None = None


class FineTuningJobExtension(BaseModel):
    """pdppo's view of the job, beside OpenAI's."""

    job_id: str = Field(description="the native job's id (`/v1/jobs/{id}`)")
    step: int
    total_steps: int
    metrics: dict[str, float] | None = None


class FineTuningJob(BaseModel):
    id: str = Field(description="ftjob-<the native job id>")
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    finished_at: int | None = None
    error: FineTuningJobError | None = None
    fine_tuned_model: str | None = Field(
        description="job:<id> once succeeded: `model` of a later job (either API) accepts it"
    )
    hyperparameters: Hyperparameters
    model: str
    organization_id: str = Field(description="the tenant")
    result_files: list[str] = Field(default_factory=list)
    seed: int
    status: Literal[
        "validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused"
    ]
    trained_tokens: int | None = None
    training_file: str | None
    validation_file: str | None = None
    estimated_finish: int | None = None
    integrations: list[dict[str, Any]] = Field(default_factory=list)
    metadata: dict[str, str] | None = None
    method: dict[str, Any] | None = None
    user_provided_suffix: str | None = None
    pdppo: FineTuningJobExtension


class FineTuningJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJob]
    has_more: bool


class FineTuningJobEvent(BaseModel):
    id: str = Field(description="ftevent-<the event's stream id>")
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    type: Literal["message", "metrics"]
    data: dict[str, Any] | None = None


class FineTuningJobEventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJobEvent]
    has_more: bool


class CheckpointMetrics(BaseModel):
    model_config = ConfigDict(extra="allow")

    step: float


class FineTuningJobCheckpoint(BaseModel):
    id: str = Field(description="ftckpt-<job id>-<step>")
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str = Field(description="its download path")
    fine_tuning_job_id: str
    metrics: CheckpointMetrics
    step_number: int


class FineTuningJobCheckpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJobCheckpoint]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class GraderRunRequest(BaseModel):
    model_config = _STRICT

    grader: OpenAIGraderConfig
    model_sample: Annotated[str, Field(max_length=100_000)]
    item: dict[str, Any] | None = None


class GraderRunErrors(BaseModel):
    formula_parse_error: bool = False
    invalid_variable_error: bool = False
    model_grader_parse_error: bool = False
    model_grader_refusal_error: bool = False
    model_grader_server_error: bool = False
    model_grader_server_error_details: str | None = None
    other_error: bool = False
    python_grader_runtime_error: bool = False
    python_grader_runtime_error_details: str | None = None
    python_grader_server_error: bool = False
    python_grader_server_error_type: str | None = None
    sample_parse_error: bool = False
    truncated_observation_error: bool = False
    unresponsive_reward_error: bool = False


class GraderRunMetadata(BaseModel):
    errors: GraderRunErrors
    execution_time: float
    name: str
    sampled_model_name: str | None = None
    scores: dict[str, Any]
    token_usage: int | None = None
    type: str


class GraderRunResponse(BaseModel):
    reward: float
    sub_rewards: dict[str, Any]
    metadata: GraderRunMetadata
    model_grader_token_usage_per_model: dict[str, Any] = Field(default_factory=dict)


class GraderValidateRequest(BaseModel):
    model_config = _STRICT

    grader: OpenAIGraderConfig


class GraderValidateResponse(BaseModel):
    grader: dict[str, Any]
