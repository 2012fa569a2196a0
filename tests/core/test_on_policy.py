"""On-policy telemetry is exactly quiet: the real trainer, fp32, one minibatch, no staleness.

The sampler and the trained policy are the same weights in the same precision, so the trust
region has nothing to see: no token masked, ratio 1, D at rounding level, and the two direction
rules never compared (D is below `DIRECTION_TOLERANCE` everywhere). With top-p < 1 this holds
only because the trained policy is truncated like the sampler (`core.objective.truncation`):
compared with the untruncated policy, top_p 0.8 read ratio 0.80 and D 0.014 on these untrained
models (0.84 and 0.16, with 31% of tokens masked, after a short warm-up). Built-in model and a
locally built Hugging Face Llama, a few seconds each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from core.config import TrainConfig
from core.models.local_hf import make_tiny_hf
from core.objective.truncation import nucleus_keep, truncate_to_nucleus
from core.rollout import sampling_logprobs
from core.training.trainer import train

TOP_PS = [1.0, 0.9, 0.8]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf(tmp_path_factory.mktemp("llama"))


def on_policy_rows(
    model: dict[str, Any], top_p: float, out: Path, warmup: int = 8, **algorithm: Any
) -> list[dict[str, float]]:
    cfg = TrainConfig.model_validate(
        {
            "model": model,
            "task": {
                "name": "reverse",
                "min_len": 2,
                "max_len": 3,
                "warmup_steps": warmup,  # a few steps of format warm-up: peaked distributions
                "warmup_lr": 3e-2,
                "warmup_batch_size": 16,
            },
            "rollout": {
                "prompts_per_step": 4,
                "group_size": 4,
                "max_new_tokens": 4,
                "top_p": top_p,
            },  # fp32 rollout, no staleness
            "algorithm": {"mask": "predictive", "minibatches": 1, "epochs": 1, "top_k": 8}
            | algorithm,
            "optim": {"lr": 1e-2},  # step 2 samples from the policy step 1 moved
            "steps": 2,
            "checkpoint_every": 0,
            "seed": 0,
            "device": "cpu",
        }
    )
    train(cfg, out)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_quiet(rows: list[dict[str, float]]) -> None:
    """Every on-policy step: nothing masked or compared, ratio 1 and D at rounding level (the
    failure lists every metric out of bounds, with its value)."""
    assert len(rows) == 2
    zero = (
        "masked_fraction",
        "direction_disagreement",
        "direction_disagreement_far",
        "masked_only_predictive",
        "masked_only_dppo",
    )
    for row in rows:
        bad = {k: row[k] for k in zero if row[k] != 0.0}
        if abs(row["ratio_mean"] - 1.0) >= 1e-4:
            bad["ratio_mean"] = row["ratio_mean"]
        for k in ("divergence_mean", "offpolicy_logratio_abs"):
            if row[k] >= 1e-5:
                bad[k] = row[k]
        assert not bad, f"step {row['step']:.0f}: {bad}"


@pytest.mark.parametrize("top_p", TOP_PS)
def test_builtin_model_on_policy_is_quiet(tmp_path: Path, top_p: float) -> None:
    model = {"name": "builtin:tiny", "tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2}}
    assert_quiet(on_policy_rows(model, top_p, tmp_path))


@pytest.mark.parametrize("top_p", TOP_PS)
def test_hf_llama_on_policy_is_quiet(llama: Path, tmp_path: Path, top_p: float) -> None:
    assert_quiet(on_policy_rows({"name": f"hf:{llama}"}, top_p, tmp_path))


def test_kl_reference_is_truncated_like_the_policy(tmp_path: Path) -> None:
    """Before the first update the policy is the reference: with top-p, both truncated by the
    same rule, the k3 penalty is exactly 0 at step 1."""
    model = {"name": "builtin:tiny", "tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2}}
    rows = on_policy_rows(model, 0.8, tmp_path, warmup=0, kl_beta=0.1)  # reference = loaded
    assert rows[0]["kl_ref"] == pytest.approx(0.0, abs=1e-7)


# -- the truncation itself -------------------------------------------------------------------


@pytest.mark.parametrize("top_p", [0.5, 0.8, 0.95])
def test_nucleus_is_the_samplers_plus_the_sampled_token(top_p: float) -> None:
    """Equal logits give the sampler's support exactly (chunked or not), and a sampled token
    outside it (a drifted policy) is added."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 500, generator=gen) * 3  # (N, V)
    temperature = 0.7
    support = torch.isfinite(sampling_logprobs(logits, temperature, top_p))
    tokens = torch.randint(0, 500, (300,), generator=gen)
    keep = nucleus_keep(logits / temperature, tokens, top_p)
    expected = support.clone()
    expected[torch.arange(300), tokens] = True
    assert torch.equal(keep, expected)
    assert (~support[torch.arange(300), tokens]).sum() > 50  # many tokens were outside
    chunked = torch.cat([nucleus_keep(c, t, top_p) for c, t in zip(
        (logits / temperature).split(7), tokens.split(7), strict=True)])  # fmt: skip
    assert torch.equal(chunked, keep)


def test_truncated_logits_give_the_truncated_policys_gradient() -> None:
    """d/dz of log pi_p(a) is onehot(a) - pi_p on the kept set and 0 elsewhere; top_p = 1 is
    the untouched tensor itself."""
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(64, 50, generator=gen) * 2).requires_grad_()
    tokens = torch.randint(0, 50, (64,), generator=gen)
    assert truncate_to_nucleus(logits, tokens, 1.0) is logits
    cut = truncate_to_nucleus(logits, tokens, 0.7)
    logp_a = -torch.nn.functional.cross_entropy(cut, tokens, reduction="none")
    logp_a.sum().backward()
    assert logits.grad is not None and torch.isfinite(logp_a).all()
    keep = nucleus_keep(logits.detach(), tokens, 0.7)
    pi_p = torch.softmax(logits.detach().masked_fill(~keep, float("-inf")), -1)
    want = torch.nn.functional.one_hot(tokens, 50).float() - pi_p
    torch.testing.assert_close(logits.grad, want * keep)
    assert (logits.grad[~keep] == 0).all() and (~keep).any()
