"""The trainer's typed configuration: every knob of a run, validated before any tensor exists.

Plain pydantic (no torch import) so that the API can validate a job spec without loading the
trainer. Groups mirror the parts of a run: which model, which task, how rollouts are sampled (and
how far the behavior policy drifts from the trained one), which trust-region mask, the optimizer,
and run-level knobs. Validation messages name the field and the offending value.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class TinyModelConfig(_Strict):
    """Shape of the built-in transformer (`builtin:tiny`); ignored for `hf:` models."""

    d_model: int = Field(
        default=64, ge=8, le=4096, description="Hidden size of the tiny transformer."
    )
    n_layers: int = Field(default=2, ge=1, le=64, description="Number of transformer blocks.")
    n_heads: int = Field(
        default=4, ge=1, le=64, description="Attention heads; must divide d_model."
    )
    max_seq_len: int = Field(
        default=128,
        ge=8,
        le=8192,
        description="Longest prompt + response the position table covers.",
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.tiny.n_heads={self.n_heads} must divide model.tiny.d_model={self.d_model}"
            )
        return self


class LoraConfig(_Strict):
    """Low-rank adapters through peft; only the adapters train, the base stays frozen."""

    r: int = Field(default=8, ge=1, le=1024, description="Adapter rank.")
    alpha: float = Field(
        default=16.0, gt=0, description="LoRA scaling numerator (scale = alpha / r)."
    )
    dropout: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Adapter dropout. Non-zero makes pi differ from mu by noise alone.",
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear", description="Module names to adapt, or 'all-linear'."
    )


class ModelConfig(_Strict):
    name: str = Field(
        default="builtin:tiny",
        description="'builtin:tiny' (made locally, no download) or 'hf:<local path or hub id>'.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="Dtype of the trained weights. Logits enter the loss in fp32.",
    )
    lora: LoraConfig | None = Field(
        default=None, description="Train LoRA adapters (hf: models only)."
    )
    tiny: TinyModelConfig = Field(
        default_factory=lambda: TinyModelConfig(), description="Shape of builtin:tiny."
    )

    @model_validator(mode="after")
    def _known_name(self) -> ModelConfig:
        if self.name != "builtin:tiny" and not (self.name.startswith("hf:") and len(self.name) > 3):
            raise ValueError(
                f"model.name={self.name!r} must be 'builtin:tiny' or 'hf:<path or hub id>'"
            )
        if self.lora is not None and not self.name.startswith("hf:"):
            raise ValueError(f"model.lora is only supported for hf: models, not {self.name!r}")
        return self


TaskName = Literal["arithmetic", "sort", "copy", "reverse", "jsonl"]


class TaskConfig(_Strict):
    name: TaskName = Field(
        default="reverse",
        description="Built-in verifiable task, or 'jsonl' for a dataset of {prompt, answer}.",
    )
    min_len: int = Field(
        default=2,
        ge=1,
        le=32,
        description="Shortest digit string (sort/copy/reverse) or operand digits.",
    )
    max_len: int = Field(
        default=4,
        ge=1,
        le=32,
        description="Longest digit string (sort/copy/reverse) or operand digits.",
    )
    path: str | None = Field(
        default=None, description="JSONL file with one {prompt, answer} per line."
    )
    match: Literal["exact", "numeric", "regex"] = Field(
        default="exact",
        description=(
            "JSONL scoring: exact string match, numeric match (within tolerance), or the "
            "answer is a regex that must fully match the stripped completion."
        ),
    )
    numeric_tolerance: float = Field(
        default=1e-6, ge=0, description="Absolute tolerance for 'numeric'."
    )
    warmup_steps: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description=(
            "Supervised format warm-up before RL, on completions of the right shape but random "
            "content (the task itself is left for RL to learn). 0 disables."
        ),
    )
    warmup_target: Literal["format", "answer"] = Field(
        default="format",
        description=(
            "What the warm-up teaches: 'format' = answer-shaped random digits (RL learns the "
            "whole task), 'answer' = the true answers (a partial head start that RL improves)."
        ),
    )
    warmup_lr: float = Field(default=3e-3, gt=0, description="Learning rate of the format warm-up.")
    warmup_batch_size: int = Field(default=32, ge=1, description="Examples per warm-up step.")

    @model_validator(mode="after")
    def _check(self) -> TaskConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"task.min_len={self.min_len} must be <= task.max_len={self.max_len}")
        if self.name == "jsonl" and not self.path:
            raise ValueError("task.path is required when task.name='jsonl'")
        if self.name == "jsonl" and self.warmup_steps:
            raise ValueError(
                f"task.warmup_steps={self.warmup_steps}: the format warm-up needs a built-in task"
            )
        if self.name != "jsonl" and self.path:
            raise ValueError(f"task.path={self.path!r} is only used when task.name='jsonl'")
        return self


class RolloutConfig(_Strict):
    prompts_per_step: int = Field(
        default=16, ge=1, description="Distinct prompts per rollout batch."
    )
    group_size: int = Field(
        default=8,
        ge=2,
        description="Completions per prompt (GRPO group); advantages are within group.",
    )
    max_new_tokens: int = Field(default=8, ge=1, le=4096, description="Cap on generated tokens.")
    temperature: float = Field(
        default=1.0,
        gt=0,
        le=10,
        description="Sampling temperature; the trainer scores pi at it too.",
    )
    top_p: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Nucleus sampling; mu is the truncated, renormalized policy.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32",
        description="Precision of the rollout copy of the policy (low precision makes mu != pi).",
    )
    staleness: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Rollouts come from the policy as it was this many steps ago (async RL).",
    )


class AlgorithmConfig(_Strict):
    mask: Literal["ppo_clip", "dppo", "predictive", "none"] = Field(
        default="predictive", description="Trust-region mask."
    )
    kind: Literal["tv", "kl", "kl_reverse"] = Field(
        default="tv", description="Divergence measured by dppo/predictive."
    )
    estimator: Literal["exact", "binary", "topk", "topk_tail"] = Field(
        default="topk",
        description="How D is estimated from the rollout's view; 'exact' stores full log-probs.",
    )
    delta_low: float = Field(
        default=0.15, gt=0, description="Threshold for A < 0 (eps_low for ppo_clip)."
    )
    delta_high: float = Field(
        default=0.15, gt=0, description="Threshold for A > 0 (eps_high for ppo_clip)."
    )
    top_k: int = Field(default=20, ge=1, le=1000, description="Top-K log-probs kept per token.")
    is_cap: float = Field(default=1e4, gt=0, description="Truncated-IS cap c on sg(pi/mu).")
    normalize_std: bool = Field(
        default=False, description="Divide group advantages by the group's reward std."
    )
    minibatches: int = Field(
        default=1,
        ge=1,
        description="Optimizer steps per rollout batch per epoch (off-policy after 1).",
    )
    epochs: int = Field(default=1, ge=1, le=100, description="Passes over each rollout batch.")


class OptimConfig(_Strict):
    lr: float = Field(default=1e-3, gt=0, le=1, description="AdamW learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(default=0.999, ge=0, lt=1, description="AdamW beta2.")
    eps: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Global gradient-norm clip.")


class TrainConfig(_Strict):
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(), description="Model to train.")
    task: TaskConfig = Field(default_factory=lambda: TaskConfig(), description="Task and reward.")
    rollout: RolloutConfig = Field(default_factory=lambda: RolloutConfig(), description="Sampling.")
    algorithm: AlgorithmConfig = Field(
        default_factory=lambda: AlgorithmConfig(), description="Loss and trust-region mask."
    )
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(), description="Optimizer.")
    steps: int = Field(
        default=100, ge=1, le=10_000_000, description="Total RL steps (rollout batches)."
    )
    checkpoint_every: int = Field(
        default=50,
        ge=0,
        description="Write a checkpoint every N steps (0: only at the end or on stop).",
    )
    keep_checkpoints: int = Field(
        default=3, ge=1, description="How many most recent checkpoints to keep on disk."
    )
    seed: int = Field(default=0, ge=0, description="Seeds model init, prompts and sampling.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="'auto' picks CUDA when available."
    )

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        batch = self.rollout.prompts_per_step * self.rollout.group_size
        if batch % self.algorithm.minibatches:
            raise ValueError(
                f"algorithm.minibatches={self.algorithm.minibatches} must divide "
                f"rollout.prompts_per_step * rollout.group_size = {batch}"
            )
        needed = self.task.max_len * 2 + 16 + self.rollout.max_new_tokens
        tiny = self.model.name == "builtin:tiny"
        if tiny and self.task.name != "jsonl" and self.model.tiny.max_seq_len < needed:
            raise ValueError(
                f"model.tiny.max_seq_len={self.model.tiny.max_seq_len} is too short for prompts "
                f"of task.max_len={self.task.max_len} plus rollout.max_new_tokens="
                f"{self.rollout.max_new_tokens} (needs >= {needed})"
            )
        return self
