"""Which loss a run takes: the fused one (`core.objective.fused`: hidden states and the output
projection, chunk by chunk, never the [tokens x vocabulary] logits) or the unfused reference.

Here, torch-free, because two parts must agree on it: the trainer takes the path
(`core.training.update`, `core.models.hf.HFLM.output_projection`), and the memory estimate
(`core.budget`) counts the logits only where that path holds them. Counted where the fused loss
runs, they were 47 GiB of a 0.8B Llama's 106 GiB estimate, over the default GPU limit (issue
49). The rule from the config alone is `fused_loss_applies`; `fused_loss_runs` adds what the
model must be, read from its config.json (`model_type`) by callers that cannot load it.
tests/core/test_budget_fused.py holds the estimate's answer to the trainer's, model kind by
model kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.config import LoraConfig, TrainConfig

FUSED_ESTIMATORS = ("binary", "topk")
"""`core.objective.fused.FUSED_ESTIMATORS`, restated (`core.objective` imports nothing from
here; tests check that the two agree): `exact` and `topk_tail` need whole rows of mu or pi."""

PROJECTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
"""Architectures whose logits are exactly `lm_head(decoder(...).last_hidden_state)`, no scaling
or soft-capping (Gemma's and Cohere's are not); tests/core/test_fused_trainer.py checks each
one's loss and gradients against the unfused path."""

OUTPUT_LAYER = "lm_head"
"""The output layer's module name in every `PROJECTED_MODEL_TYPES` model."""


def fused_loss_applies(cfg: TrainConfig) -> bool:
    """`algorithm.fused_loss` where the fused loss computes what the unfused one does: the
    `binary` and `topk` estimators, and no top-p truncation (the nucleus needs each row's
    sorted probabilities, `core.objective.truncation`). The model must have a plain output
    projection too (`CausalLM.output_projection`, `fused_loss_runs`); where any of it fails
    the unfused loss runs, with the same results up to fp32 rounding."""
    a = cfg.algorithm
    return a.fused_loss and a.estimator in FUSED_ESTIMATORS and cfg.rollout.top_p >= 1.0


def adapts_output_layer(lora: LoraConfig | None) -> bool:
    """Whether peft wraps the output layer in a LoRA layer: only when `target_modules` names
    it (peft matches a name whole or as a dotted suffix, and the output layer's name has no
    dot; "all-linear" leaves the output layer alone). Its logits are then not a plain
    projection."""
    return (
        lora is not None
        and lora.target_modules != "all-linear"
        and (OUTPUT_LAYER in lora.target_modules)
    )


def projects_plainly(*, builtin: bool, model_type: str | None, lora: LoraConfig | None) -> bool:
    """Whether the model's logits are a plain projection of its final hidden states
    (`CausalLM.output_projection` is not None): the built-in model's always; a Hugging Face
    model's when it is one of the `PROJECTED_MODEL_TYPES` (its config.json's `model_type`;
    None: unknown) and LoRA leaves its output layer alone. FSDP changes nothing: the output
    layer stays a plain linear layer, read through the root (`core.parallel.sharding`)."""
    if builtin:
        return True
    return model_type in PROJECTED_MODEL_TYPES and not adapts_output_layer(lora)


def fused_loss_runs(cfg: TrainConfig, *, builtin: bool, model_type: str | None) -> bool:
    """Whether the trainer's RL loss is fused: `fused_loss_applies` on a model that
    `projects_plainly`."""
    return fused_loss_applies(cfg) and projects_plainly(
        builtin=builtin, model_type=model_type, lora=cfg.model.lora
    )
