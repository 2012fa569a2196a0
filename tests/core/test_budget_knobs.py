"""core.budget for the issue-10 knobs: the KL reference's memory, gradient accumulation's smaller
forward passes, and `job:<id>` models sized from the earlier job's saved final model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from core.budget import estimate, tiny_param_count
from core.config import TrainConfig
from core.models.hf import make_tiny_hf
from core.models.tiny import TinyLM

SMALL: dict[str, Any] = {
    "model": {"tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}},
    "task": {"name": "reverse", "min_len": 2, "max_len": 3},
    "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
    "algorithm": {"top_k": 8},
    "steps": 8,
}
PARAMS = 46_560  # tiny_param_count(32, 1, 32)


def cfg(**overrides: Any) -> TrainConfig:
    data: dict[str, Any] = json.loads(json.dumps(SMALL))
    for key, value in overrides.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return TrainConfig.model_validate(data)


def item(budget: Any, name: str) -> int:
    return int(sum(m.bytes for m in budget.memory if m.name == name))


def test_kl_reference_is_a_frozen_copy_in_the_training_dtype() -> None:
    plain = estimate(cfg())
    kl = estimate(cfg(algorithm={"kl_beta": 0.1}))
    assert item(plain, "reference") == item(plain, "reference_forward") == 0
    assert item(kl, "reference") == 4 * PARAMS  # fp32 weights, no gradient, no optimizer state
    bf16 = estimate(cfg(algorithm={"kl_beta": 0.1}, model={"dtype": "bfloat16"}))
    assert item(bf16, "reference") == 2 * PARAMS
    # its no-grad forward over one micro-batch: 16 rows, 17 positions, V = 512
    assert item(kl, "reference_forward") > 16 * 5 * 512 * 4 * 2
    blamed = {m.field for m in kl.memory if m.name.startswith("reference")}
    assert blamed == {"train.algorithm.kl_beta"}
    assert kl.peak_memory_bytes == plain.peak_memory_bytes + item(kl, "reference") + item(  # type: ignore[operator]
        kl, "reference_forward"
    )


def test_lora_reference_costs_no_copy(tmp_path: Path) -> None:
    hf = make_tiny_hf(tmp_path / "llama")
    spec = {
        "model": {"name": f"hf:{hf}", "lora": {"r": 4}},
        "task": {"name": "reverse", "min_len": 2, "max_len": 4},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
        "algorithm": {"kl_beta": 0.1},
    }
    budget = estimate(TrainConfig.model_validate(spec))
    assert item(budget, "reference") == 0 and item(budget, "reference_forward") > 0
    # the final model: a deep copy with the adapters merged in (fp32 here), then serialized;
    # `save_merged: false` saves the adapter alone
    assert budget.params is not None
    assert item(budget, "merged_copy") == item(budget, "serialized_weights") == 4 * budget.params
    adapter_only = estimate(TrainConfig.model_validate({**spec, "save_merged": False}))
    assert item(adapter_only, "merged_copy") == 0


def test_accumulation_shrinks_the_forward_pass_not_the_rollout() -> None:
    whole = estimate(cfg())
    split = estimate(cfg(optim={"grad_accumulation": 2}))

    # builtin:tiny shares each prompt's 13 positions among its rows (d 32, 1 layer, fp32):
    # 20 d values a token and layer plus 20 d for the embeddings and gradients in flight, each
    # row's copy of the prompt's keys and values, and three bool (T, T) masks a row. 16 rows of
    # 4 prompts in one piece; 8 consecutive rows, 3 prompts at most, in each of two pieces
    def activations(rows: int, prompts: int) -> int:
        tokens = prompts * 13 + rows * 4
        return tokens * (20 * 32 * 4) * 2 + rows * 13 * 2 * 32 * 4 + rows * 17 * 17 * 3

    assert item(whole, "activations") == activations(16, 4) == 661_040
    assert item(split, "activations") == activations(8, 3) == 397_080
    assert item(split, "logits") < item(whole, "logits")
    assert item(split, "kv_cache") == item(whole, "kv_cache")
    assert split.peak_memory_bytes < whole.peak_memory_bytes  # type: ignore[operator]


def test_job_model_is_sized_from_its_saved_final(tmp_path: Path) -> None:
    from core.config import TinyModelConfig

    shape = TinyModelConfig(d_model=48, n_layers=2, n_heads=4, max_seq_len=40)
    torch.manual_seed(0)
    TinyLM(shape).save_final(tmp_path / "final")
    spec = cfg(model={"name": "job:abc123"})  # the spec's tiny dims are not the model's
    seen = estimate(spec, model_dir=tmp_path / "final")
    assert seen.params == tiny_param_count(48, 2, 40)
    assert seen.model_source.startswith("job:abc123 (d_model=48")
    assert item(seen, "weights") == 4 * seen.params  # type: ignore[operator]
    unseen = estimate(spec)
    assert unseen.params is None and unseen.peak_memory_bytes is None
    assert "the worker sizes it" in unseen.model_source


def test_job_model_saved_by_hugging_face_reads_its_headers(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    hf = make_tiny_hf(tmp_path / "final")
    real = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(str(hf)).parameters())
    budget = estimate(cfg(model={"name": "job:xyz"}), model_dir=hf)
    assert budget.params == real and "safetensors headers" in budget.model_source


@pytest.mark.parametrize("content", ["not json", json.dumps({"model": "builtin:tiny"})])
def test_job_model_with_a_broken_config_has_no_estimate(tmp_path: Path, content: str) -> None:
    (tmp_path / "config.json").write_text(content)
    assert estimate(cfg(model={"name": "job:xyz"}), model_dir=tmp_path).params is None
