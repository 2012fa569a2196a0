"""The final model of an `hf:` job, written as folders that transformers, PEFT and vLLM load
without pdppo (docs/users/using-the-model.md):

    final/                      the trained model, merged (a full fine-tune, or LoRA with
      config.json               `save_merged`, the default): `AutoModelForCausalLM`,
      model.safetensors         `vllm serve final/`, a later job's `model.name: job:<id>`
      generation_config.json
      tokenizer.json, tokenizer_config.json, chat_template.jinja (when the base had one)
      adapter/                  LoRA jobs only, always: PEFT's own format, for
        adapter_config.json     `PeftModel.from_pretrained(base, final/adapter)` or
        adapter_model.safetensors  `AutoPeftModelForCausalLM`; its `base_model_name_or_path`
        tokenizer files         is the base as the job loaded it (a path on the worker)

The merged copy is kept by default because it is what every consumer can load on its own: a
downloaded adapter needs its base, and the base's path in adapter_config.json is the worker's.
With `save_merged: false`, final/ holds only adapter/ (a large base is not copied per job), and
`job:<id>` applies it to the base it names (`adapter_only_base`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import Tensor

ADAPTER_DIR = "adapter"
_CONFIG_BYTES = 1 << 20


def save_hf_final(
    path: Path,
    module: Any,
    tokenizer: Any,
    *,
    lora: bool,
    merged: bool = True,
    state: dict[str, Tensor] | None = None,
) -> None:
    """Write `module` (a transformers model, or a PEFT one when `lora`) into `path` as above.
    `state`: the gathered weights of a sharded run, whose module holds only its shard (sharded
    runs refuse LoRA, `TrainConfig._check_sharding`)."""
    import copy

    path.mkdir(parents=True, exist_ok=True)
    if lora:
        if state is not None:
            raise ValueError("a gathered state of a LoRA model is not saved (sharding refuses it)")
        adapter = path / ADAPTER_DIR
        module.save_pretrained(str(adapter), safe_serialization=True)
        tokenizer.save_pretrained(str(adapter))
        if not merged:
            return
        module = copy.deepcopy(module).merge_and_unload()
    kwargs: dict[str, Any] = {"state_dict": state} if state is not None else {}
    # generation_config.json too (`vllm serve` and `pipeline` read EOS and pad from it): a
    # causal LM always has one, the base's or, for a base without, the one its config implies
    # (tests/core/test_hf_final.py checks both)
    module.save_pretrained(str(path), safe_serialization=True, **kwargs)
    tokenizer.save_pretrained(str(path))


def adapter_only_base(folder: Path) -> str | None:
    """The base an adapter-only final model (`save_merged: false`) was trained on, as its
    adapter_config.json names it; None for a folder that holds a whole model (config.json)."""
    if (folder / "config.json").exists():
        return None
    config = folder / ADAPTER_DIR / "adapter_config.json"
    if not config.is_file() or config.stat().st_size > _CONFIG_BYTES:
        return None
    meta = json.loads(config.read_text())
    base = meta.get("base_model_name_or_path") if isinstance(meta, dict) else None
    if not isinstance(base, str) or not base:
        raise ValueError(f"{config} names no base model (base_model_name_or_path)")
    return base


def merge_adapter(module: Any, adapter: Path) -> Any:
    """`module` (the base) with the PEFT adapter in `adapter` merged into its weights."""
    from peft import PeftModel

    return PeftModel.from_pretrained(module, os.fspath(adapter)).merge_and_unload()
