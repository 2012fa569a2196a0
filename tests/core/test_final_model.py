"""A job's final model (`out_dir/final`) is the trained model: reloaded, it computes the logits
the trained policy computed, to 1e-6, on a fixed batch, and not those of the untrained one.

The trained policy's logits are taken from the live model at the moment the trainer saves it (a
spy on the family's `save_final` runs it on the batch first), so the comparison is with the
weights training produced, not with another copy read back from disk. (The reload test this
replaces checked shapes, which a loader leaving the weights at their random init also has.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from core.config import ModelConfig, TrainConfig
from core.models import CausalLM, Tokenizer, load_model
from core.models.hf import HFLM, make_tiny_hf
from core.models.tiny import TinyLM, load_tiny_final
from core.training.trainer import train

PROMPTS = ["reverse 123=", "copy 90=", "sort 4312=", "7"]
TOLERANCE = 1e-6
TRAINED_APART = 1e-3  # training moves some logit by more than this here


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: these models' ops are too small to split, and on a busy machine extra
    threads spin (this file took 3x longer with 2 threads on 2 loaded cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fixed_batch(tok: Tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PROMPTS as (input ids, attention mask, position ids), right-padded with token 0."""
    rows = [tok.encode_prompt(p) for p in PROMPTS]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    positions = torch.arange(width).expand(len(rows), width)
    return ids, mask, positions


def logits_of(lm: CausalLM) -> torch.Tensor:
    with torch.no_grad():
        logits, _ = lm.forward(*fixed_batch(lm.tokenizer))
    return logits.float()


def capture_final(monkeypatch: pytest.MonkeyPatch, family: type[CausalLM]) -> list[torch.Tensor]:
    """The logits of each model `family.save_final` saves, computed just before it does."""
    seen: list[torch.Tensor] = []
    save: Callable[..., None] = family.save_final

    def spy(self: CausalLM, path: Path, **kwargs: Any) -> None:
        seen.append(logits_of(self))
        save(self, path, **kwargs)

    monkeypatch.setattr(family, "save_final", spy)
    return seen


def assert_reproduces(reloaded: CausalLM, trained: torch.Tensor, untrained: torch.Tensor) -> None:
    again = logits_of(reloaded)
    assert again.shape == trained.shape == untrained.shape
    assert (again - trained).abs().max().item() <= TOLERANCE
    assert (again - untrained).abs().max().item() > TRAINED_APART


def test_tiny_final_model_reproduces_the_trained_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Protects `TinyLM.save_final` / `load_tiny_final` (and `load_model` for a `job:` name):
    the saved weights are the trained ones, and reloading restores every one of them."""
    cfg = TrainConfig.model_validate(
        {
            "model": {"tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}},
            # a supervised warm-up first: an untrained model's completions rarely earn a reward
            # (no advantage, no RL update), and the weights must move for the test to mean much
            "task": {"name": "reverse", "min_len": 2, "max_len": 3, "warmup_steps": 5},
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
            "algorithm": {"mask": "predictive", "top_k": 8},
            "optim": {"lr": 3e-3},
            "steps": 2,
            "seed": 0,
            "device": "cpu",
        }
    )
    torch.manual_seed(cfg.seed)  # as the trainer does: the same initial weights
    untrained = logits_of(load_model(cfg.model, torch.device("cpu")))
    seen = capture_final(monkeypatch, TinyLM)

    result = train(cfg, tmp_path)

    assert result.final_model == tmp_path / "final" and len(seen) == 1
    assert_reproduces(load_tiny_final(result.final_model), seen[0], untrained)
    as_job = load_model(
        ModelConfig(name="job:earlier"), torch.device("cpu"), model_dir=result.final_model
    )
    assert_reproduces(as_job, seen[0], untrained)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_hf_final_model_reproduces_the_trained_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lora: bool
) -> None:
    """Protects `HFLM.save_final` and loading `hf:<out_dir/final>`: the saved model (LoRA
    adapters merged in) computes what the trained policy computed."""
    base = make_tiny_hf(tmp_path / "base")
    data = tmp_path / "data.jsonl"
    # a random model's completions start with a filler token <wN>; about half match: rewards
    # differ within groups, so the steps move the weights
    data.write_text(
        "".join(json.dumps({"prompt": p, "answer": "<w[0-2].*"}) + "\n" for p in PROMPTS)
    )
    cfg = TrainConfig.model_validate(
        {
            "model": {"name": f"hf:{base}", "lora": {"r": 4, "alpha": 8} if lora else None},
            "task": {"name": "jsonl", "path": str(data), "match": "regex"},
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
            "algorithm": {"mask": "predictive", "estimator": "topk", "top_k": 20},
            "optim": {"lr": 1e-2},
            "steps": 2,
            "device": "cpu",
        }
    )
    untrained = logits_of(load_model(ModelConfig(name=f"hf:{base}"), torch.device("cpu")))
    seen = capture_final(monkeypatch, HFLM)

    result = train(cfg, tmp_path / "run")

    assert result.final_model == tmp_path / "run" / "final" and len(seen) == 1
    reloaded = load_model(ModelConfig(name=f"hf:{result.final_model}"), torch.device("cpu"))
    assert_reproduces(reloaded, seen[0], untrained)
