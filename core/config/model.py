"""The `model` section of the trainer's configuration: which model trains, in which dtype, with
which adapters, and the built-in model's shape. Kept apart from `core.config` (which re-exports
it) to keep that module short; the same strict rules apply (`core.config`'s docstring).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from core.config.task import MAX_PATH_CHARS
from core.config.types import CleanStr, FiniteFloat, Strict, no_control_chars

JOB_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What `job:<id>` accepts as an id (the API's ids are 24 hex digits)."""


class TinyModelConfig(Strict):
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
    vocab_size: int = Field(
        default=512,
        ge=512,
        le=262144,
        description=(
            "Output vocabulary. Ids past the byte tokenizer's 512 are padding the tokenizer "
            "never encodes nor decodes, like its reserved ids: an LLM-sized loss on a tiny model."
        ),
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.tiny.n_heads={self.n_heads} must divide model.tiny.d_model={self.d_model}"
            )
        return self


class LoraConfig(Strict):
    """Low-rank adapters through peft; only the adapters train, the base stays frozen."""

    r: int = Field(default=8, ge=1, le=1024, description="Adapter rank.")
    alpha: FiniteFloat = Field(
        default=16.0, gt=0, le=65536, description="LoRA scaling numerator (scale = alpha / r)."
    )
    dropout: FiniteFloat = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Adapter dropout. Non-zero makes pi differ from mu by noise alone.",
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        max_length=1024,
        description="Module names to adapt (at most 1024, each 1-200 characters), or 'all-linear'.",
    )

    @field_validator("target_modules")
    @classmethod
    def _module_names(cls, value: list[str] | str) -> list[str] | str:
        """Checked here rather than by an annotated item type, whose errors inside the union
        would be located by a long type repr instead of the field."""
        if isinstance(value, list):
            for i, name in enumerate(value):
                if not 1 <= len(name) <= 200:
                    raise PydanticCustomError(
                        "string_length",
                        "entry {i} must have 1 to 200 characters, not {n}",
                        {"i": i, "n": len(name)},
                    )
                no_control_chars(name, f"entry {i} ")
        return value


class ModelConfig(Strict):
    name: CleanStr = Field(
        default="builtin:tiny",
        max_length=MAX_PATH_CHARS,
        description=(
            "'builtin:tiny' (made locally, no download), 'hf:<local path or hub id>', or "
            "'job:<job id>': the final model of one of the tenant's own earlier jobs."
        ),
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
        if self.name.startswith("job:"):
            if not JOB_ID_RE.fullmatch(self.name[4:]):
                raise ValueError(
                    f"model.name={self.name!r}: 'job:' must be followed by a job id "
                    "(1-64 characters of letters, digits, '-' and '_')"
                )
        elif self.name != "builtin:tiny" and not (
            self.name.startswith("hf:") and len(self.name) > 3
        ):
            raise ValueError(
                f"model.name={self.name!r} must be 'builtin:tiny', 'hf:<path or hub id>' or "
                "'job:<job id>'"
            )
        if self.lora is not None and not self.name.startswith("hf:"):
            raise ValueError(f"model.lora is only supported for hf: models, not {self.name!r}")
        return self
