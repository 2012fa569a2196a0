"""Model loading: `builtin:tiny` (local, tiny), `hf:` (Hugging Face causal LMs) and `job:<id>`
(the final model of an earlier job, in whichever of the two families it was trained).

Imports: `core.config`, `core.disk` (a model's files read safely), `core.extras` (the `lora`
extra), `core.tasks` (a task's `Example`, which a tokenizer encodes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from core.config import ModelConfig
from core.disk.safe_files import open_regular_file
from core.models.base import CausalLM, Tokenizer

__all__ = ["CausalLM", "Tokenizer", "final_model_family", "load_model"]

_CONFIG_BYTES = 1 << 20  # a config.json is a few KiB; a larger one is not one we wrote


def final_model_family(folder: Path) -> str:
    """`builtin:tiny` or `hf`: which loader a final model (`out_dir/final`) needs.

    `core.models.tiny.TinyLM.save_final` writes a config.json that names `builtin:tiny` (with
    the model's dims); `save_pretrained` writes Hugging Face's own, which has no `model` key.
    An adapter-only LoRA model (`save_merged: false`) has no config.json but adapter/'s.
    Raises ValueError for a folder without a readable config.json."""
    if (
        not (folder / "config.json").exists()
        and (folder / "adapter" / "adapter_config.json").exists()
    ):
        return "hf"
    try:
        with open_regular_file(folder / "config.json", None, max_bytes=_CONFIG_BYTES) as fh:
            meta = json.loads(fh.read())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder} holds no readable model config.json ({exc})") from exc
    if isinstance(meta, dict) and meta.get("model") == "builtin:tiny":
        return "builtin:tiny"
    return "hf"


def load_model(
    cfg: ModelConfig,
    device: torch.device,
    data_roots: Sequence[str] | None = None,
    model_dir: Path | None = None,
) -> CausalLM:
    """Build the policy on `device`. The caller seeds torch first (tiny init draws from it).
    `data_roots`: where a local `hf:` model may lie (None: anywhere, as for `pdppo train`).
    `model_dir`: the folder a `job:<id>` name stands for (the worker finds it in its artifact
    store); the saved model's own shape and family win over `cfg.tiny`."""
    from core.models.tiny import TinyLM

    lm: CausalLM
    if cfg.name.startswith("job:"):
        lm = _load_job_model(cfg, model_dir)
    elif cfg.name == "builtin:tiny":
        lm = TinyLM(cfg.tiny)
    else:
        from core.models.hf import HFLM

        lm = HFLM(cfg, data_roots=data_roots)
    if isinstance(lm, TinyLM) and cfg.dtype == "bfloat16":  # HFLM loads in its dtype itself
        lm.module.to(torch.bfloat16)
    lm.module.to(device)
    return lm


def _load_job_model(cfg: ModelConfig, model_dir: Path | None) -> CausalLM:
    if model_dir is None:
        raise ValueError(
            f"model.name={cfg.name!r} names the final model of a service job, which only a "
            "worker can find (in its artifact store); a local run can start from a downloaded "
            "Hugging Face final model with model.name='hf:<folder>'"
        )
    if final_model_family(model_dir) == "builtin:tiny":
        from core.models.tiny import load_tiny_final

        return load_tiny_final(model_dir)
    from core.models.hf import HFLM

    return HFLM(cfg, folder=model_dir)
