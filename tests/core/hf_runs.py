"""A Hugging Face model trained by the trainer and its logits, for the final-model tests
(tests/core/test_hf_final.py, tests/vllm/test_vllm_final.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from core.config import ModelConfig, TrainConfig
from core.models.hf import HFLM, HFTokenizer
from core.models.local_hf import LlamaShape, make_chat_hf
from core.training.trainer import train


def train_hf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, lora: bool, save_merged: bool = True
) -> tuple[Path, Path, torch.Tensor, torch.Tensor]:
    """A two-step job on a local chat Llama: (base folder, final folder, the trained policy's
    logits at its save, the untrained model's), on the same `prompt_ids`."""
    base = make_chat_hf(tmp_path / "base", shape=SHAPE)
    from transformers import AutoTokenizer

    ids = prompt_ids(AutoTokenizer.from_pretrained(str(base)))
    data = tmp_path / "data.jsonl"
    # a random model's completions are random characters; about half start with one of these:
    # rewards differ within groups, so the steps move the weights
    data.write_text(
        "".join(json.dumps({"prompt": p, "answer": "[^a-m].*"}) + "\n" for p in PROMPTS)
    )
    cfg = TrainConfig.model_validate(
        {
            "model": {"name": f"hf:{base}", "lora": {"r": 4, "alpha": 8} if lora else None},
            "task": {"name": "jsonl", "path": str(data), "match": "regex"},
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 3},
            "algorithm": {"mask": "predictive", "estimator": "topk", "top_k": 20},
            "optim": {"lr": 3e-2},
            "steps": 2,
            "save_merged": save_merged,
            "device": "cpu",
        }
    )
    untrained = trainer_logits(HFLM(ModelConfig(name=f"hf:{base}")), ids)
    seen: list[torch.Tensor] = []
    save: Callable[..., None] = HFLM.save_final

    def spy(self: HFLM, path: Path, **kwargs: Any) -> None:
        seen.append(trainer_logits(self, ids))
        save(self, path, **kwargs)

    monkeypatch.setattr(HFLM, "save_final", spy)
    result = train(cfg, tmp_path / "run")
    assert result.final_model == tmp_path / "run" / "final" and len(seen) == 1
    assert (seen[0] - untrained).abs().max().item() > TRAINED_APART
    return base, result.final_model, seen[0], ids


PROMPTS = ["12+7=", "3*45=", "9-51=", "10/4="]


TRAINED_APART = 1e-3  # the two steps move some logit by more than this here


SHAPE = LlamaShape(hidden=64, heads=1, kv_heads=1, layers=1, intermediate=128)
"""One head of 64 dimensions, which vLLM's CPU kernels need (tests/vllm loads it too)."""


def prompt_ids(tok: Any) -> torch.Tensor:
    """PROMPTS through the chat template as the trainer renders them, all of one length: one
    unpadded batch, so that every load path sees the same ids and no padding convention
    differs."""
    rows = [HFTokenizer(tok).encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    assert len({len(r) for r in rows}) == 1
    return torch.tensor(rows)


def trainer_logits(lm: HFLM, ids: torch.Tensor) -> torch.Tensor:
    """The policy as the trainer computes it (`HFLM.forward`, adapters on for LoRA)."""
    mask = torch.ones_like(ids)
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        logits, _ = lm.forward(ids, mask, positions, use_cache=False)
    return logits.float()
