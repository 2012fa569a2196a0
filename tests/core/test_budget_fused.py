"""The memory estimate counts the loss the trainer runs: for every model kind (builtin:tiny,
Hugging Face Llama, tied or not, Qwen2, Qwen3, GPT-2, LoRA, FSDP on two processes), with the
fused loss asked for and not, `core.budget`'s `fused_loss` is what one real training step did.
What the step did is counted, not assumed: the fused statistics pass
(`core.objective.fused.projected_stats`) runs only on the fused path.

Before issue 49's fix the estimate counted every `hf:` model's loss unfused: the six rows of the
Llama, Qwen and LoRA kinds that fuse failed ("the estimate says unfused"), and a 0.8B
Llama's estimate held 47 GiB of logits that the fused loss never holds
(tests/core/test_budget.py, tests/integration/test_budget_api.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import core.models.hf
import core.objective.fused as fused_module
from bench.budget_calibration import measure
from core.budget import estimate, model_shape
from core.budget.shapes import SHARED_PREFIX_MODEL_TYPES
from core.config import ModelConfig, TrainConfig
from core.config import fused as fused_rule
from core.models import load_model
from core.models.local_hf import PRINTABLE, LlamaShape, char_tokenizer, save_model
from core.training.trainer import train

FAMILIES = {  # model folder: (model_type, tied output layer)
    "llama": ("llama", False),
    "llama-tied": ("llama", True),
    "qwen2": ("qwen2", False),
    "qwen3": ("qwen3", False),
    "gpt2": ("gpt2", False),
}
LORA = {"r": 4, "alpha": 8}
LORA_QV = {**LORA, "target_modules": ["q_proj", "v_proj"]}
LORA_HEAD = {**LORA, "target_modules": ["q_proj", "lm_head"]}
OFF = {"algorithm": {"fused_loss": False}}

# (id, model folder or "tiny", the config's own sections, whether the trainer fuses the loss)
KINDS: list[tuple[str, str, dict[str, Any], bool]] = [
    ("builtin", "tiny", {}, True),
    ("builtin-off", "tiny", OFF, False),
    ("builtin-exact", "tiny", {"algorithm": {"estimator": "exact"}}, False),
    ("llama", "llama", {}, True),
    ("llama-off", "llama", OFF, False),
    ("llama-top-p", "llama", {"rollout": {"top_p": 0.9}}, False),
    ("llama-tied", "llama-tied", {}, True),
    ("qwen2", "qwen2", {}, True),
    ("qwen2-off", "qwen2", OFF, False),
    ("qwen2-topk-tail", "qwen2", {"algorithm": {"estimator": "topk_tail"}}, False),
    ("qwen3", "qwen3", {}, True),
    ("gpt2", "gpt2", {}, False),  # asked for, but no plain output projection
    ("lora", "llama", {"model": {"lora": LORA}}, True),
    ("lora-off", "llama", {"model": {"lora": LORA}, **OFF}, False),
    ("lora-qv", "qwen2", {"model": {"lora": LORA_QV}}, True),
    ("lora-head", "llama", {"model": {"lora": LORA_HEAD}}, False),  # peft wraps the output layer
]
FSDP_KINDS: list[tuple[str, str, dict[str, Any], bool]] = [
    ("fsdp-llama", "llama", {}, True),
    ("fsdp-llama-off", "llama", OFF, False),
    ("fsdp-builtin", "tiny", {}, True),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small random models of each family with a character tokenizer (600 entries), built
    here."""
    root = tmp_path_factory.mktemp("budget-fused")
    specials = ("<pad>", "<s>", "</s>", "<unk>")
    tok = char_tokenizer(specials, PRINTABLE, fillers=600 - len(specials) - len(PRINTABLE))
    shape = LlamaShape(hidden=32, heads=4, kv_heads=2, layers=2, intermediate=64, max_positions=64)
    for name, (model_type, tied) in FAMILIES.items():
        save_model(root / name, tok, shape, model_type=model_type, tied=tied, seed=1)
    return {name: root / name for name in FAMILIES}


def config(model: str, sections: dict[str, Any], models: dict[str, Path]) -> dict[str, Any]:
    """One step of a small batch; `sections` merged into it section by section."""
    base: dict[str, Any] = {
        "model": {"tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}}
        if model == "tiny"
        else {"name": f"hf:{models[model]}"},
        "task": {"name": "reverse", "min_len": 2, "max_len": 3},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "algorithm": {"top_k": 8},
        "steps": 1,
        "checkpoint_every": 0,
        "seed": 0,
        "device": "cpu",
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return base


def _count_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real: Callable[..., Any] = fused_module.projected_stats

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(fused_module, "projected_stats", counting)
    return calls


@pytest.mark.parametrize(
    ("model", "sections", "fused"), [k[1:] for k in KINDS], ids=[k[0] for k in KINDS]
)
def test_the_estimate_counts_the_loss_one_training_step_runs(
    model: str,
    sections: dict[str, Any],
    fused: bool,
    models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = TrainConfig.model_validate(config(model, sections, models))
    passes = _count_passes(monkeypatch)
    train(cfg, tmp_path / "run")
    assert (passes[0] > 0) is fused, f"the trainer ran {passes[0]} fused passes"
    budget = estimate(cfg)
    assert budget.fused_loss is fused, "the estimate says " + ("un" if fused else "") + "fused"
    assert budget.peak_memory_bytes is not None


@pytest.mark.parametrize(
    ("model", "sections", "fused"), [k[1:] for k in FSDP_KINDS], ids=[k[0] for k in FSDP_KINDS]
)
def test_the_estimate_counts_the_loss_of_two_sharded_ranks(
    model: str, sections: dict[str, Any], fused: bool, models: dict[str, Path]
) -> None:
    """FSDP on two gloo processes (bench/budget_calibration.py's runner): every rank takes the
    path the estimate counts."""
    data = config(model, {**sections, "sharding": "fsdp"}, models)
    data["rollout"]["prompts_per_step"] = 4  # two groups a rank
    ran = measure(data, ranks=2, timeout=300)
    assert len(ran.fused_passes) == 2
    assert all((n > 0) is fused for n in ran.fused_passes), ran.fused_passes
    budget = estimate(TrainConfig.model_validate(data), devices=2)
    assert budget.fused_loss is fused


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("lora", [None, LORA, {**LORA, "target_modules": ["lm_head"]}])
def test_the_shape_says_what_the_loaded_model_does(
    name: str, lora: dict[str, Any] | None, models: dict[str, Path]
) -> None:
    """What the estimate reads from config.json (the architecture, prefix sharing) and the
    rule it applies (a plain output projection) are what the loaded model says."""
    cfg = TrainConfig.model_validate(
        {"model": {"name": f"hf:{models[name]}", "lora": lora}, "device": "cpu"}
    )
    shape = model_shape(cfg)
    lm = load_model(cfg.model, torch.device("cpu"))
    assert shape.model_type == FAMILIES[name][0]
    assert shape.shares_prefix is lm.shares_prefix
    plain = fused_rule.projects_plainly(
        builtin=False, model_type=shape.model_type, lora=cfg.model.lora
    )
    assert plain is (lm.output_projection() is not None)


def test_the_restated_constants_are_the_trainers() -> None:
    """`core.config` and `core.budget` import no torch, so they restate these."""
    assert fused_rule.FUSED_ESTIMATORS == fused_module.FUSED_ESTIMATORS
    assert SHARED_PREFIX_MODEL_TYPES == core.models.hf.SHARED_PREFIX_MODEL_TYPES
    assert fused_rule.PROJECTED_MODEL_TYPES is core.models.hf.PROJECTED_MODEL_TYPES


def test_the_output_layer_is_adapted_only_where_lora_names_it() -> None:
    """peft's matching: a target equal to the module's name or a dotted suffix of it; the
    output layer's name, `lm_head`, has no dot ("all-linear" leaves it out)."""
    cases = [
        (None, False),
        ("all-linear", False),
        (["q_proj", "v_proj"], False),
        (["lm_head"], True),
        (["q_proj", "lm_head"], True),
        (["head"], False),
        (["model.lm_head"], False),
    ]
    for targets, adapted in cases:
        model = ModelConfig.model_validate(
            {"name": "hf:x", "lora": None if targets is None else {"target_modules": targets}}
        )
        assert fused_rule.adapts_output_layer(model.lora) is adapted, targets


def test_the_tiny_models_root_is_what_its_blocks_leave() -> None:
    """FSDP keeps the root (embeddings, final norm, output layer) gathered: `root_params` is
    the model's parameters outside its blocks, counted on the real module, and for d_model 32,
    1 layer, 32 positions and the 512-token vocabulary 2*512*32 + 32*32 + 2*32 = 33856."""
    cfg = TrainConfig.model_validate(
        {"model": {"tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}}}
    )
    lm = load_model(cfg.model, torch.device("cpu"))
    outside = sum(
        p.numel() for name, p in lm.module.named_parameters() if not name.startswith("blocks.")
    )
    shape = model_shape(cfg)
    assert shape.root_params == outside == 33856
    assert shape.params == sum(p.numel() for p in lm.module.parameters())
    assert shape.shares_prefix is lm.shares_prefix is True


def test_an_hf_models_root_is_outside_its_layers_and_an_unread_one_shares_no_prefix(
    tmp_path: Path,
) -> None:
    """From config.json alone: the embeddings and the untied output layer (600 x 32 each) and
    the final norm (32) are the root, 38432 of 56992; the two layers are not. A model not read
    here claims no prefix sharing (the worker decides again with the loaded model)."""
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", **LLAMA_CONFIG}))
    shape = model_shape(
        TrainConfig.model_validate({"model": {"name": f"hf:{folder}"}, "device": "cpu"})
    )
    assert (shape.root_params, shape.params) == (38432, 56992)
    unread = model_shape(
        TrainConfig.model_validate({"model": {"name": f"hf:{tmp_path / 'none'}"}, "device": "cpu"})
    )
    assert unread.params is None
    assert unread.shares_prefix is False


LLAMA_CONFIG = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "vocab_size": 600,
    "max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    ("model_type", "extra", "version", "shares"),
    [
        ("llama", {}, "5.0.0", True),
        ("qwen3", {}, "5.0.0", True),
        ("qwen2", {"use_sliding_window": True}, "5.0.0", False),
        ("qwen3", {"layer_types": ["full_attention", "sliding_attention"]}, "5.0.0", False),
        ("llama", {"layer_types": ["full_attention", "full_attention"]}, "5.0.0", True),
        ("gpt2", {}, "5.0.0", False),
        ("llama", {}, "4.57.1", False),
        ("llama", {}, "6.1.0", True),
        ("llama", {}, None, False),
        ("llama", {}, "dev", False),
    ],
    ids=[
        "llama",
        "qwen3",
        "sliding",
        "a-sliding-layer",
        "full-layers",
        "gpt2",
        "t4",
        "t6",
        "no-transformers",
        "unreadable-version",
    ],
)
def test_prefix_sharing_takes_a_listed_family_full_attention_and_transformers_5(
    model_type: str,
    extra: dict[str, Any],
    version: str | None,
    shares: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every condition of `shares_prefix`, each failing alone: a family outside the list, a
    sliding window (any layer), a transformers older than 5 (its major version read from the
    installed package's metadata, x.0.0 so that a minor or patch number read instead is 0; none
    installed, or a version that is not a number, count as older)."""
    import importlib.metadata

    import core.budget.shapes as shapes

    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": model_type, **LLAMA_CONFIG, **extra})
    )
    real = importlib.metadata.version

    def installed(name: str) -> str:
        if name != "transformers":
            return real(name)
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", installed)
    shapes._transformers_major.cache_clear()  # cached for the process: read again here
    try:
        cfg = TrainConfig.model_validate({"model": {"name": f"hf:{folder}"}, "device": "cpu"})
        shape = model_shape(cfg)
    finally:
        shapes._transformers_major.cache_clear()
    assert shape.model_type == model_type
    assert shape.shares_prefix is shares
