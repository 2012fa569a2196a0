"""The fused loss in the trainer (`algorithm.fused_loss`): the models' hidden states and output
projections give their own logits and gradients, and a training run with it on is the run with
it off, up to fp32 rounding."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor

import core.objective.fused as fused_module
from core.config import ModelConfig, TinyModelConfig, TrainConfig
from core.models import CausalLM, load_model
from core.models.local_hf import make_tiny_hf
from core.models.tiny import TinyLM
from core.objective.loss import policy_loss
from core.objective.masks import TrustRegion
from core.rollout import RolloutBatch, generate, response_logits, response_projection
from core.training.trainer import train
from core.training.update import fused_loss_applies

TIMING = {"tokens_per_s", "rollout_time", "update_time", "step_time"}


def run_config(fused: bool, **algorithm: Any) -> TrainConfig:
    """A few steps of the tiny model with a padded vocabulary, the warm-up and the KL penalty
    (so the fused warm-up and reference log-probs run too), two minibatches."""
    return TrainConfig.model_validate(
        {
            "model": {
                "tiny": {
                    "d_model": 32,
                    "n_layers": 1,
                    "n_heads": 2,
                    "max_seq_len": 32,
                    "vocab_size": 1000,
                }
            },
            "task": {"name": "reverse", "min_len": 2, "max_len": 3, "warmup_steps": 3},
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
            "algorithm": {
                "top_k": 8,
                "minibatches": 2,
                "kl_beta": 0.1,
                "fused_loss": fused,
                **algorithm,
            },
            "optim": {"lr": 3e-3},
            "steps": 3,
            "checkpoint_every": 0,
            "seed": 0,
            "device": "cpu",
        }
    )


def _count_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the fused statistics passes (the loss's, the reference's, the warm-up's)."""
    calls = [0]
    real: Callable[..., Any] = fused_module.projected_stats

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(fused_module, "projected_stats", counting)
    return calls


def test_a_training_run_is_the_same_fused_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_passes(monkeypatch)
    runs = {}
    for fused in (True, False):
        before = calls[0]
        cfg = run_config(fused)
        assert fused_loss_applies(cfg) is fused
        train(cfg, tmp_path / str(fused))
        # 3 warm-up steps; per step the reference's 2 micro-batches and the 2 minibatches
        assert calls[0] - before == (3 + 3 * (2 + 2) if fused else 0)
        lines = (tmp_path / str(fused) / "metrics.jsonl").read_text().splitlines()
        runs[fused] = [json.loads(line) for line in lines]
    assert len(runs[True]) == len(runs[False]) == 3
    for fused, unfused in zip(runs[True], runs[False], strict=True):
        assert fused.keys() == unfused.keys()
        for name in fused.keys() - TIMING:
            assert fused[name] == pytest.approx(unfused[name], rel=1e-4, abs=1e-6), name
    assert runs[True][-1]["kl_ref"] > 0  # the reference is in the loss
    a = load_file(str(tmp_path / "True" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "False" / "final" / "model.safetensors"))
    assert a["head.weight"].shape == (1000, 32)
    initial = TinyLM(run_config(True).model.tiny)
    # AdamW divides each entry's step by its gradient's running rms, so entries whose gradient
    # is rounding (the keys' bias: attention ignores it) move by steps of the learning rate's
    # size either way: 1e-6 to 4e-6 relative per tensor here, 1.3e-5 for qkv.bias
    for name, w in a.items():
        assert float((w - b[name]).norm() / w.norm()) < 2e-5, name
    whole = torch.cat([w.flatten() for w in a.values()])
    assert float((whole - torch.cat([b[n].flatten() for n in a])).norm() / whole.norm()) < 5e-6
    # it trained: the comparison is not of two copies of the initial weights
    assert float((a["head.weight"] - initial.module.state_dict()["head.weight"]).abs().max()) > 1e-3


@pytest.mark.parametrize(
    ("algorithm", "why"),
    [
        ({"estimator": "exact"}, "the exact estimator needs the full behavior distribution"),
        ({"estimator": "topk_tail"}, "topk_tail is a full-vocabulary computation"),
        ({"fused_loss": False}, "switched off"),
    ],
)
def test_the_unfused_loss_runs_where_the_fused_one_does_not_apply(
    algorithm: dict[str, Any], why: str
) -> None:
    assert not fused_loss_applies(run_config(True, **algorithm)), why
    top_p = run_config(True).model_dump()
    top_p["rollout"]["top_p"] = 0.9  # the nucleus needs whole rows of probabilities
    assert not fused_loss_applies(TrainConfig.model_validate(top_p))


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random models of each projected family, a tied Llama, and GPT-2 (not projected),
    with make_tiny_hf's character tokenizer, built here."""
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GPT2Config,
        LlamaConfig,
        Qwen2Config,
        Qwen3Config,
    )

    root = tmp_path_factory.mktemp("fused-families")
    llama = make_tiny_hf(root / "llama")
    tok = AutoTokenizer.from_pretrained(str(llama))
    ids = {
        "vocab_size": len(tok),
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }
    shape = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    }
    configs = {
        "llama-tied": LlamaConfig(**shape, **ids, tie_word_embeddings=True),
        "qwen2": Qwen2Config(**shape, **ids, tie_word_embeddings=False),
        "qwen3": Qwen3Config(**shape, **ids, head_dim=8, tie_word_embeddings=False),
        "gpt2": GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, **ids),
    }
    dirs = {"llama": llama}
    for name, config in configs.items():
        torch.manual_seed(1)
        path = root / name
        AutoModelForCausalLM.from_config(config).save_pretrained(str(path))
        tok.save_pretrained(str(path))
        dirs[name] = path
    return dirs


def build(family: str, dirs: dict[str, Path]) -> CausalLM:
    """The model of `family`, its output layer scaled up so that its distributions are peaked
    like a trained model's (a random one's are nearly uniform: no mask would bite)."""
    torch.manual_seed(0)
    lm: CausalLM
    if family == "tiny":
        lm = TinyLM(TinyModelConfig(d_model=32, n_layers=2, n_heads=2, vocab_size=700))
    else:
        name, lora = family.removesuffix("-lora"), family.endswith("-lora")
        cfg = ModelConfig.model_validate(
            {"name": f"hf:{dirs[name]}", "lora": {"r": 4, "alpha": 8} if lora else None}
        )
        lm = load_model(cfg, torch.device("cpu"))
    projection = lm.output_projection()
    with torch.no_grad():
        if projection is not None:
            projection[0].mul_(10.0)
        for n, p in lm.module.named_parameters():
            if "lora_B" in n:  # B starts at 0, which would leave A without a gradient
                p.normal_(std=0.1)
    return lm


def off_policy_batch(lm: CausalLM) -> RolloutBatch:
    """Rollouts of 3 prompts x 4, sampled before the weights are moved a little (so the
    trust region has something to mask), the moved weights kept."""
    tok = lm.tokenizer
    prompts = [tok.encode_prompt(p) for p in ("12+3=", "abc", "7*8=") for _ in range(4)]
    batch = generate(
        lm, prompts, max_new_tokens=6, temperature=0.8, top_k=8, generator=torch.manual_seed(3)
    )
    with torch.no_grad():
        for _, p in lm.trainable():
            p.add_(torch.randn_like(p) * float(p.std()))
    return batch


def _loss_and_grads(
    lm: CausalLM, logits: Tensor | Any, batch: RolloutBatch
) -> tuple[Any, dict[str, Tensor]]:
    for _, p in lm.trainable():
        p.grad = None
    adv = torch.linspace(-1.0, 1.5, len(batch.tokens))
    out = policy_loss(
        logits=logits,
        tokens=batch.tokens,
        behavior=batch.behavior,
        advantages=adv,
        region=TrustRegion(delta_low=0.02, delta_high=0.02),
    )
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in lm.trainable() if p.grad is not None}


@pytest.mark.parametrize("family", ["tiny", "llama", "llama-tied", "llama-lora", "qwen2", "qwen3"])
def test_a_models_projection_gives_its_logits_loss_and_gradients(
    family: str, hf_dirs: dict[str, Path]
) -> None:
    lm = build(family, hf_dirs)
    batch = off_policy_batch(lm)
    proj = response_projection(lm, batch, 0.8)
    assert proj is not None
    logits = response_logits(lm, batch, 0.8)
    torch.testing.assert_close(proj.materialize().detach(), logits.detach(), rtol=1e-5, atol=1e-5)

    want, want_grads = _loss_and_grads(lm, logits, batch)
    got, got_grads = _loss_and_grads(lm, response_projection(lm, batch, 0.8), batch)
    assert torch.equal(got.keep, want.keep) and not want.keep.all()
    assert float(got.loss.detach()) == pytest.approx(float(want.loss.detach()), rel=1e-5)
    for name, value in want.stats.items():
        assert got.stats[name] == pytest.approx(value, rel=1e-5, abs=1e-9), name
    assert got_grads.keys() == want_grads.keys() and len(want_grads) > 0
    for name, g in want_grads.items():
        assert float(g.norm()) > 0, name
        assert float((got_grads[name] - g).norm() / g.norm()) < 1e-4, name
    weight, _ = lm.output_projection() or (None, None)
    assert weight is not None
    if family == "llama-lora":  # the output layer is frozen: no gradient for it, none computed
        assert not weight.requires_grad
    if family == "llama-tied":  # the projection is the embedding: one gradient, both uses
        embed = lm.module.get_input_embeddings().weight  # type: ignore[operator]
        assert weight is embed and any("embed_tokens" in n for n in want_grads)


def test_a_model_without_a_plain_projection_keeps_the_logits(hf_dirs: dict[str, Path]) -> None:
    """GPT-2 is not in `PROJECTED_MODEL_TYPES`: no projection, and the trainer's loss falls
    back to the logits (`response_projection` gives None)."""
    lm = build("gpt2", hf_dirs)
    assert lm.output_projection() is None
    batch = off_policy_batch(lm)
    assert response_projection(lm, batch, 1.0) is None
    with pytest.raises(TypeError, match="final hidden states"):
        lm.forward_hidden(batch.input_ids, batch.attention_mask, batch.position_ids())
