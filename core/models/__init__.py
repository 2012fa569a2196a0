"""Model loading: `builtin:tiny` (local, tiny) and `hf:` (Hugging Face causal LMs)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.config import ModelConfig
from core.models.base import CausalLM, Tokenizer

__all__ = ["CausalLM", "Tokenizer", "load_model"]


def load_model(
    cfg: ModelConfig, device: torch.device, data_roots: Sequence[str] | None = None
) -> CausalLM:
    """Build the policy on `device`. The caller seeds torch first (tiny init draws from it).
    `data_roots`: where a local `hf:` model may lie (None: anywhere, as for `pdppo train`)."""
    lm: CausalLM
    if cfg.name == "builtin:tiny":
        from core.models.tiny import TinyLM

        lm = TinyLM(cfg.tiny)
        if cfg.dtype == "bfloat16":
            lm.module.to(torch.bfloat16)
    else:
        from core.models.hf import HFLM

        lm = HFLM(cfg, data_roots=data_roots)
    lm.module.to(device)
    return lm
