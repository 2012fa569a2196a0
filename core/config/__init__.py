"""The trainer's typed configuration: every knob of a run, validated before any tensor exists.

The package: `TrainConfig` and its run-level sections here; the model's section in `model`, the
task's in `task`, the graders a task declares in `graders`, and the validated value types every
section shares in `types`. Imports: pydantic, and nothing else from `core` (the API and the
client validate specs with it, and every other package reads it).

Plain pydantic (no torch import) so that the API can validate a job spec without loading the
trainer. Groups mirror the parts of a run: which model, which task, how rollouts are sampled (and
how far the behavior policy drifts from the trained one), which trust-region mask, the optimizer,
and run-level knobs. Validation messages name the field and the offending value.

One spec must not be able to take a shared worker down, so validation is strict:

- no coercion: `"3"` is not an int, `true` is not a number, `"true"` is not a bool (an int is
  still a valid float);
- no NaN or infinity in any number (`FiniteFloat`: "must be finite"), wherever it comes from
  (JSON `NaN`/`Infinity`, `1e400`, YAML `.inf`);
- every number has finite bounds: the limits below are generous (far past any sensible run) and
  only keep out values that are nonsense or crash the trainer (a temperature of 1e-300 turns the
  sampler's log-probs into NaN, a 24-digit seed overflows torch's seeding). Whether a job fits a
  worker's memory is a separate check;
- no control characters (`CleanStr`) in names and paths, which end up in logs and file systems.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, model_validator

# the model and task sections live in modules of their own; every section stays importable here
from core.config.corrections import OWN_WEIGHT, NoCorrection
from core.config.corrections import Correction as Correction
from core.config.model import JOB_ID_RE as JOB_ID_RE
from core.config.model import LoraConfig as LoraConfig
from core.config.model import ModelConfig as ModelConfig
from core.config.model import TinyModelConfig as TinyModelConfig
from core.config.task import BUILTIN_TASKS as BUILTIN_TASKS
from core.config.task import FILE_ID_RE as FILE_ID_RE
from core.config.task import MAX_PATH_CHARS as MAX_PATH_CHARS
from core.config.task import TaskConfig as TaskConfig
from core.config.task import TaskName as TaskName
from core.config.types import (
    FINITE,
    FiniteFloat,
    Strict,
)

SEED_OFFSETS = 3
"""The trainer seeds its generators with seed, seed + 1, seed + 2 and seed + 3."""

TRACKER_WORDS = ("mlflow", "wandb", "tensorboard", "tracking", "tracker", "api_key")
"""Words of a train-level key that tries to set where or as whom the run reports."""

MAX_SEED = 2**63 - 1 - SEED_OFFSETS
"""Largest seed: seed + SEED_OFFSETS must still fit torch's signed 64-bit seed."""


MAX_OFF_POLICY_STEPS = 1000
"""Largest `rollout.max_off_policy_steps` (like `rollout.staleness`'s)."""


class RolloutConfig(Strict):
    prompts_per_step: int = Field(
        default=16, ge=1, le=65536, description="Distinct prompts per rollout batch."
    )
    group_size: int = Field(
        default=8,
        ge=2,
        le=4096,
        description="Completions per prompt (GRPO group); advantages are within group.",
    )
    max_new_tokens: int = Field(default=8, ge=1, le=4096, description="Cap on generated tokens.")
    temperature: FiniteFloat = Field(
        default=1.0,
        ge=0.01,
        le=10,
        description=(
            "Sampling temperature; the trainer scores pi at it too. At least 0.01: logits / "
            "temperature must stay finite in fp32 (near 0 use a small value, not greedy)."
        ),
    )
    top_p: FiniteFloat = Field(
        default=1.0,
        ge=1e-6,
        le=1,
        description=(
            "Nucleus sampling; mu is the truncated, renormalized policy, and the trained policy "
            "is truncated the same way (its own nucleus plus the sampled token), so on-policy "
            "the ratio is 1 for any top_p. Prefer algorithm.kind 'tv' with top_p < 1: a KL "
            "between nuclei that differ is infinite. At least 1e-6 (below fp32's resolution "
            "every token would be cut and the log-probs become NaN)."
        ),
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
    engine: Literal["hf", "vllm"] = Field(
        default="hf",
        description=(
            "What samples the rollouts: 'hf', the trainer's own KV-cache loop, or 'vllm', a vLLM "
            "engine in the job's process (the `vllm` extra; hf: models), given the trained "
            "weights (LoRA merged in) before every rollout and returning its top-K view of "
            "what it sampled (core.rollout.vllm_engine)."
        ),
    )
    mode: Literal["sync", "async"] = Field(
        default="sync",
        description=(
            "'sync': the rollout and the update take turns, each waiting for the other. "
            "'async': a rollout server in its own process (the hf engine, on CPU) samples the "
            "next steps' groups while the trainer updates, and gets the new weights after "
            "every optimizer step; samples are at most rollout.max_off_policy_steps policy "
            "versions old (core.rollout.server)."
        ),
    )
    max_off_policy_steps: int = Field(
        default=1,
        ge=0,
        le=MAX_OFF_POLICY_STEPS,
        description=(
            "mode 'async': how many optimizer steps older than the trained policy a sample's "
            "policy may be; older samples are dropped and counted (dropped_samples). 0 is "
            "on-policy: the same results as mode 'sync'. Ignored in mode 'sync'."
        ),
    )
    vllm_memory: FiniteFloat = Field(
        default=0.3,
        gt=0,
        le=0.95,
        description=(
            "engine 'vllm': the share of the device's memory vLLM takes for its weights and KV "
            "cache (its gpu_memory_utilization; on CPU a share of the NUMA node's RAM); the "
            "trainer shares the device and needs the rest."
        ),
    )

    @model_validator(mode="after")
    def _check_async(self) -> RolloutConfig:
        """What an async run cannot do (yet), said at submit rather than after the job
        started."""
        if self.mode != "async":
            return self
        if self.staleness > 0:
            raise ValueError(
                f"rollout.staleness={self.staleness} imitates an older sampler inside the sync "
                "loop; with rollout.mode='async' the sampler really is older: leave staleness at "
                "0 and bound the age with rollout.max_off_policy_steps"
            )
        if self.engine != "hf":
            raise ValueError(
                f"rollout.mode='async' runs the hf engine in its server for now, not "
                f"rollout.engine={self.engine!r}: use engine 'hf' or mode 'sync'"
            )
        return self


IS_CAP_OFF = 1e4
"""`algorithm.is_cap`'s default: large enough that the truncation is effectively off (DPPO's)."""

LossAgg = Literal["token_mean", "seq_mean", "minibatch_token_mean"]
LOSS_AGGS: tuple[str, ...] = get_args(LossAgg)


class AlgorithmConfig(Strict):
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
    delta_low: FiniteFloat = Field(
        default=0.15, gt=0, le=100, description="Threshold for A < 0 (eps_low for ppo_clip)."
    )
    delta_high: FiniteFloat = Field(
        default=0.15, gt=0, le=100, description="Threshold for A > 0 (eps_high for ppo_clip)."
    )
    top_k: int = Field(default=20, ge=1, le=1000, description="Top-K log-probs kept per token.")
    is_cap: FiniteFloat = Field(
        default=IS_CAP_OFF,
        gt=0,
        le=1e12,
        description=(
            "Truncated-IS cap c on sg(pi/mu), with correction 'none' or 'geo_rs' (the other "
            "corrections set the weight themselves and refuse a cap here)."
        ),
    )
    correction: Correction = Field(
        default_factory=lambda: NoCorrection(),
        description=(
            "Off-policy correction, combined with any mask: its weight replaces min(pi/mu, "
            "is_cap) and the tokens it drops lose their gradient. type 'none' (the default), "
            "'tis' / 'mis' (level token or sequence, cap), 'icepop' (band low..high), 'geo_rs' "
            "(sequence band low..high on the geometric-mean ratio) or 'cispo' (eps_low, "
            "eps_high). See docs/users/corrections.md."
        ),
    )
    normalize_std: bool = Field(
        default=False, description="Divide group advantages by the group's reward std."
    )
    minibatches: int = Field(
        default=1,
        ge=1,
        le=65536,
        description="Optimizer steps per rollout batch per epoch (off-policy after 1).",
    )
    epochs: int = Field(default=1, ge=1, le=100, description="Passes over each rollout batch.")
    kl_beta: FiniteFloat = Field(
        default=0.0,
        ge=0,
        le=100,
        description=(
            "Coefficient of a KL penalty to the reference (initial) policy, k3 estimator as in "
            "GRPO. 0 (the default) keeps no reference model and costs nothing."
        ),
    )
    fused_loss: bool = Field(
        default=True,
        description=(
            "Compute the loss from the last hidden states and the output projection in "
            "vocabulary chunks (core.objective.fused), never holding the [tokens x vocabulary] "
            "logits. Applies to the binary and topk estimators with top_p 1, on builtin:tiny and "
            "Llama/Qwen hf: models; elsewhere the unfused loss runs."
        ),
    )
    loss_agg: LossAgg = Field(
        default="token_mean",
        description=(
            "How token losses add up. 'token_mean' (the default, DAPO's): every response token "
            "of the rollout batch weighs the same; with M minibatches each divides its token "
            "sum by (batch tokens / M). 'seq_mean': each sequence's token mean, averaged over "
            "the minibatch's sequences (a short answer weighs as much as a long one). "
            "'minibatch_token_mean': each minibatch divides by its own token count. With one "
            "minibatch 'token_mean' and 'minibatch_token_mean' are the same."
        ),
    )

    @model_validator(mode="after")
    def _one_weight(self) -> AlgorithmConfig:
        """is_cap and a correction that sets its own weight would both say what a token weighs."""
        kind = self.correction.type
        if kind in OWN_WEIGHT and self.is_cap != IS_CAP_OFF:
            raise ValueError(
                f"algorithm.is_cap={self.is_cap:g} and correction.type={kind!r} both set the "
                f"IS weight: leave is_cap at {IS_CAP_OFF:g} (the {kind} correction's own "
                "parameters set it), or use correction 'none' or 'geo_rs' with is_cap"
            )
        return self


LR_FROM_SCRATCH = 1e-3
"""Default `optim.lr` for `builtin:tiny`, a model trained from random weights."""

LR_FULL_FINETUNE = 1e-6
"""Default `optim.lr` for full fine-tuning of a pretrained model (`hf:`, `job:`); TRL's GRPO
and verl default to 1e-6 (1e-3 collapsed a pretrained Llama to one-token answers in 5 steps)."""

LR_LORA = 1e-5
"""Default `optim.lr` with LoRA adapters: 10x full fine-tuning (adapters start at zero and
have far fewer parameters to move)."""


class OptimConfig(Strict):
    lr: Annotated[float, Field(gt=0, le=1), FINITE] | None = Field(
        default=None,
        description=(
            "AdamW learning rate (peak of optim.schedule). Unset (null), it follows the model: "
            f"{LR_FROM_SCRATCH:g} for builtin:tiny (trained from scratch), {LR_FULL_FINETUNE:g} "
            f"for full fine-tuning of hf: and job: models, {LR_LORA:g} with model.lora. A job: "
            "model that continues a builtin:tiny run gets the fine-tuning rate too: set lr to "
            "keep the from-scratch one. The validated spec holds the resolved value."
        ),
    )
    weight_decay: FiniteFloat = Field(default=0.0, ge=0, le=10, description="AdamW weight decay.")
    beta1: FiniteFloat = Field(default=0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: FiniteFloat = Field(default=0.999, ge=0, lt=1, description="AdamW beta2.")
    eps: FiniteFloat = Field(
        default=1e-8,
        ge=1e-16,
        le=1,
        description=(
            "AdamW epsilon. At least 1e-16: a smaller one rounds to 0 in fp32, and a parameter "
            "without gradient then divides 0 by 0 (NaN weights)."
        ),
    )
    max_grad_norm: FiniteFloat = Field(
        default=1.0, gt=0, le=1e9, description="Global gradient-norm clip."
    )
    schedule: Literal["constant", "linear", "cosine"] = Field(
        default="constant",
        description=(
            "Learning rate over the RL steps after the warm-up: constant, or decayed linearly "
            "or along a cosine to lr * min_lr_ratio at the last step."
        ),
    )
    lr_warmup_steps: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        description="RL steps over which the learning rate ramps linearly from 0 to lr.",
    )
    min_lr_ratio: FiniteFloat = Field(
        default=0.0, ge=0, le=1, description="Final learning rate of linear/cosine, as lr * this."
    )
    grad_accumulation: int = Field(
        default=1,
        ge=1,
        le=65536,
        description=(
            "Micro-batches per optimizer update: each minibatch's gradient is accumulated over "
            "this many pieces (same update, less activation memory)."
        ),
    )

    @property
    def peak_lr(self) -> float:
        """`lr`, resolved: a TrainConfig fills an unset lr from its model (`default_lr`)."""
        if self.lr is None:
            raise ValueError(
                "optim.lr is unset: it is resolved from model.name when validated as part of a "
                "TrainConfig; give optim.lr to use an OptimConfig alone"
            )
        return self.lr


def default_lr(model: ModelConfig) -> float:
    """The learning rate an unset `optim.lr` means for `model` (see `OptimConfig.lr`)."""
    if model.name == "builtin:tiny":
        return LR_FROM_SCRATCH
    return LR_LORA if model.lora is not None else LR_FULL_FINETUNE


class TrainConfig(Strict):
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
        le=10_000_000,
        description="Write a checkpoint every N steps (0: only at the end or on stop).",
    )
    keep_checkpoints: int = Field(
        default=3, ge=1, le=1000, description="How many most recent checkpoints to keep on disk."
    )
    save_merged: bool = Field(
        default=True,
        description=(
            "With model.lora: also save the adapters merged into the base as a whole Hugging "
            "Face model in final/ (loadable alone by transformers and vLLM, and by a later "
            "job:<id>, without the base), beside the PEFT adapter in final/adapter/, which is "
            "always saved. False: final/ holds only adapter/ (a later job:<id> then applies it "
            "to the base it names, which must still be where it was). Ignored without LoRA."
        ),
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=MAX_SEED,
        description="Seeds model init, prompts and sampling (at most 2**63 - 4).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="'auto' picks CUDA when available."
    )
    sharding: Literal["replicate", "fsdp"] = Field(
        default="replicate",
        description=(
            "With several processes (resources.gpus, pdppo train --nproc): 'replicate' keeps a "
            "whole model and optimizer in each; 'fsdp' shards weights, gradients and optimizer "
            "state over them (torch FSDP2), for a model that does not fit one device. One "
            "process trains unsharded either way."
        ),
    )
    eval_every: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        description=(
            "Evaluate the policy on the held-out set every N steps and after the last one "
            "(0: never). Needs a validation file or task.validation_fraction."
        ),
    )
    eval_on_start: bool = Field(
        default=False,
        description=(
            "With eval_every, also evaluate the starting policy (after any warm-up, before the "
            "first RL step), as step 0: the baseline the later evaluations compare with."
        ),
    )
    eval_samples: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Sampled completions per held-out prompt (pass@k for k > 1).",
    )
    eval_greedy: bool = Field(
        default=True, description="Also score one greedy completion per held-out prompt."
    )
    eval_max_prompts: int = Field(
        default=256, ge=1, le=100_000, description="At most this many held-out prompts."
    )
    log_samples_every: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        description="Publish a few prompt/completion/reward triples every N steps (0: never).",
    )
    log_samples_count: int = Field(
        default=4, ge=1, le=64, description="Triples per `samples` event."
    )
    silent_steps: int = Field(
        default=5,
        ge=0,
        le=10_000_000,
        description=(
            "Warn when the first N steps all have zero advantage (a reward of 0, or constant "
            "within every group), so nothing is learned (0: never warn)."
        ),
    )

    report_to: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=list,
        max_length=3,
        description=(
            "Experiment trackers the run reports to, besides the service's dashboard: each "
            "step's metrics, the evaluations, the config and its changes, samples and "
            "checkpoints. Names only: where a tracker is and as whom it reports (a tracking "
            "URI, a W&B project, a key) is the operator's setting (PDPPO_MLFLOW_TRACKING_URI, "
            "PDPPO_WANDB_PROJECT, ...), never a spec's. Each needs its extra on the worker "
            "(pip install 'pdppo[tensorboard]'); a tracker that is down never stops the run."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_tracker_settings(cls, data: Any) -> Any:
        """A spec names trackers; their addresses and credentials are the operator's. Said
        plainly rather than as an unknown field, since a user coming from TRL expects them."""
        if not isinstance(data, dict):
            return data
        named = sorted(
            key
            for key in data
            if isinstance(key, str)
            and key != "report_to"
            and any(word in key.lower() for word in TRACKER_WORDS)
        )
        for entry in data.get("report_to") or []:
            if not isinstance(entry, str) or any(c in entry for c in ":/=@"):
                named.append(f"report_to entry {str(entry)[:80]!r}")
        if named:
            raise ValueError(
                f"{', '.join(named)}: a spec names its trackers only (report_to: "
                "[tensorboard, mlflow, wandb]); tracking URIs, projects and credentials are set "
                "by the operator (PDPPO_MLFLOW_TRACKING_URI, PDPPO_WANDB_PROJECT, "
                "PDPPO_WANDB_ENTITY, WANDB_API_KEY), never in a spec"
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.optim.lr is None:
            # resolved once, here: the trainer, the budget, `--dry-run` and the stored spec
            # all read the same number
            self.optim.lr = default_lr(self.model)
        batch = self.rollout.prompts_per_step * self.rollout.group_size
        if batch % self.algorithm.minibatches:
            raise ValueError(
                f"algorithm.minibatches={self.algorithm.minibatches} must divide "
                f"rollout.prompts_per_step * rollout.group_size = {batch}"
            )
        per_update = batch // self.algorithm.minibatches
        if per_update % self.optim.grad_accumulation:
            raise ValueError(
                f"optim.grad_accumulation={self.optim.grad_accumulation} must divide the "
                f"completions per update, rollout.prompts_per_step * rollout.group_size / "
                f"algorithm.minibatches = {per_update}"
            )
        if len(set(self.report_to)) != len(self.report_to):
            raise ValueError(f"report_to={self.report_to} names a tracker twice")
        self._check_engine()
        self._check_sharding()
        t = self.task
        held_out = t.validation_path or t.validation_file or t.validation_fraction
        if t.name == "reasoning_gym":  # 100 held-out rows unless validation_size says 0
            held_out = t.validation_size != 0
        if self.eval_every and not held_out:
            raise ValueError(
                f"eval_every={self.eval_every} needs held-out data: task.validation_file, "
                "task.validation_path or task.validation_fraction (task.validation_size for "
                "reasoning_gym)"
            )
        if t.name == "environment" and self.model.name == "builtin:tiny":
            raise ValueError(
                "task.name='environment' needs a model with a chat template (an hf: model whose "
                "tokenizer defines one; examples/build_chat_model.py builds one): the "
                "environment's turns are rendered with it. builtin:tiny has none"
            )
        if t.name == "environment" and self.rollout.mode == "async":
            raise ValueError(
                "task.name='environment' plays its episodes in the trainer's process for now: "
                "use rollout.mode='sync' (the rollout server samples single-turn prompts only)"
            )
        needed = self.task.max_len * 2 + 16 + self.rollout.max_new_tokens
        tiny = self.model.name == "builtin:tiny"
        if tiny and self.task.name in BUILTIN_TASKS and self.model.tiny.max_seq_len < needed:
            raise ValueError(
                f"model.tiny.max_seq_len={self.model.tiny.max_seq_len} is too short for prompts "
                f"of task.max_len={self.task.max_len} plus rollout.max_new_tokens="
                f"{self.rollout.max_new_tokens} (needs >= {needed})"
            )
        return self

    def _check_sharding(self) -> None:
        """What a sharded run cannot do yet (`core.parallel.sharding`): a second copy of the model,
        or adapters over a frozen base."""
        if self.sharding != "fsdp":
            return
        refused = {
            "rollout.mode='async'": self.rollout.mode == "async",
            "rollout.staleness > 0": self.rollout.staleness > 0,
            "a rollout.dtype other than model.dtype": self.rollout.dtype != self.model.dtype,
            "algorithm.kl_beta > 0": self.algorithm.kl_beta > 0,
            "model.lora": self.model.lora is not None,
        }
        named = [what for what, present in refused.items() if present]
        if named:
            raise ValueError(f"sharding='fsdp' does not support {', '.join(named)} yet")

    def _check_engine(self) -> None:
        """vLLM loads the model from its folder or hub id and returns only a top-K view; what
        it cannot serve is refused here, at submit, not after the job has started."""
        if self.rollout.engine != "vllm":
            return
        name = self.model.name
        if not (name.startswith("hf:") or name.startswith("job:")):
            raise ValueError(
                f"rollout.engine='vllm' needs a Hugging Face model (hf:<folder or hub id>, or "
                f"job:<id> of one), not {name!r}"
            )
        if self.task.name == "environment":
            raise ValueError(
                "task.name='environment' samples its turns with rollout.engine='hf' for now"
            )
        if self.algorithm.estimator == "exact":
            raise ValueError(
                "algorithm.estimator='exact' needs the full behavior distribution, which vLLM "
                "does not return: use 'topk', 'topk_tail' or 'binary' with rollout.engine='vllm'"
            )

    def data_parallel_problem(self, processes: int) -> str | None:
        """Why this config cannot train as `processes` data-parallel processes (None: it can).
        Checked by the job spec at submit (`resources.gpus`) and by every run
        (`core.parallel.distributed.check_world`)."""
        if processes == 1:
            return None
        if self.rollout.mode == "async":
            return "rollout.mode='async' trains in one process for now: use mode 'sync'"
        if self.rollout.prompts_per_step % processes:
            return (
                f"rollout.prompts_per_step={self.rollout.prompts_per_step} must split evenly over "
                f"{processes} processes (each takes whole groups)"
            )
        return None
