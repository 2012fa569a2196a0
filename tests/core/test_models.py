"""Hugging Face models through the same trainer: a tiny Llama saved locally (no hub), trained for
two steps with full weights and with LoRA, saved as safetensors that transformers loads alone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from core.config import ModelConfig, TrainConfig
from core.models import load_model
from core.models.hf import make_tiny_hf
from core.training.trainer import train


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf(tmp_path_factory.mktemp("tiny-llama"))


def hf_config(path: Path, data: Path, lora: bool) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {"name": f"hf:{path}", "lora": {"r": 4, "alpha": 8} if lora else None},
            "task": {"name": "jsonl", "path": str(data), "match": "regex"},
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
            "algorithm": {"mask": "predictive", "estimator": "topk", "top_k": 20},
            "optim": {"lr": 1e-2},
            "steps": 2,
            "checkpoint_every": 1,
            "device": "cpu",
        }
    )


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_hf_model_trains_two_steps_and_saves_safetensors(
    hf_dir: Path, tmp_path: Path, lora: bool
) -> None:
    from transformers import AutoModelForCausalLM

    # a random model's completions start with a filler token <wN>; about half match: the
    # rewards differ within groups, so advantages and gradients are not zero
    data = tmp_path / "data.jsonl"
    data.write_text(
        json.dumps({"prompt": "12+3=", "answer": "<w[0-2].*"})
        + "\n"
        + json.dumps({"prompt": "copy 7=", "answer": "<w[0-2].*"})
        + "\n"
    )
    cfg = hf_config(hf_dir, data, lora)
    torch.manual_seed(cfg.seed)
    before = load_model(cfg.model, torch.device("cpu"))
    assert before.tokenizer.vocab_size >= 512
    trainable = {n: p.detach().clone() for n, p in before.trainable()}
    if lora:
        assert trainable and all("lora_" in n for n in trainable)

    result = train(cfg, tmp_path / "run")
    assert result.step == 2 and result.final_model is not None
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 2 and all(math.isfinite(v) for r in rows for v in r.values())

    # the saved checkpoint holds exactly the trainable weights, and every one of them moved
    from safetensors.torch import load_file

    ckpt = load_file(str(tmp_path / "run" / "checkpoints" / "step-000002" / "model.safetensors"))
    assert set(ckpt) == set(trainable)
    assert [n for n, t in trainable.items() if torch.equal(t, ckpt[n])] == []

    final = result.final_model
    assert (final / "model.safetensors").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(str(final))
    original = AutoModelForCausalLM.from_pretrained(str(hf_dir))
    w_new = reloaded.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    w_old = original.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(w_new, w_old)  # LoRA adapters were merged into the saved weights


def test_hf_bfloat16_policy_loads_in_bfloat16(hf_dir: Path) -> None:
    lm = load_model(ModelConfig(name=f"hf:{hf_dir}", dtype="bfloat16"), torch.device("cpu"))
    assert lm.dtype == torch.bfloat16


def test_hf_rollout_with_cache_matches_the_training_forward(hf_dir: Path) -> None:
    """Left padding, position ids and the KV cache agree with one full pass (fp32, no drift)."""
    from core.rollout import generate, response_logits

    torch.manual_seed(0)
    lm = load_model(ModelConfig(name=f"hf:{hf_dir}"), torch.device("cpu"))
    prompts = [lm.tokenizer.encode_prompt(t) for t in ["12+3=", "reverse 4567=", "x"] * 3]
    batch = generate(
        lm, prompts, max_new_tokens=5, top_k=20, generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        logp = torch.log_softmax(response_logits(lm, batch, 1.0), -1)
    mu_a = batch.behavior.token_logprobs
    assert torch.allclose(logp.gather(-1, batch.tokens[:, None])[:, 0], mu_a, atol=1e-4)
