"""The masked policy loss: its gradient, aggregation, truncation and logged statistics."""

from __future__ import annotations

import pytest
import torch

from core import policy_loss, trust_region_mask
from core.masks import MASKS
from core.synthetic import positions


@pytest.mark.parametrize("mask", MASKS)
def test_gradient_is_the_masked_truncated_policy_gradient(mask: str) -> None:
    p = positions(256, 300, k=20, gap=1.5, seed=0)
    rmask = torch.rand(256, generator=torch.Generator().manual_seed(1)) > 0.2
    cap = 2.0
    logits = p.logits.clone().requires_grad_()
    out = policy_loss(
        logits=logits,
        tokens=p.tokens,
        behavior=p.behavior,
        advantages=p.advantages,
        response_mask=rmask,
        mask=mask,  # type: ignore[arg-type]
        delta_low=0.1,
        delta_high=0.1,
        is_cap=cap,
    )
    out.loss.backward()
    assert logits.grad is not None

    keep = trust_region_mask(
        p.logits,
        p.behavior,
        p.tokens,
        p.advantages,
        mask,
        delta_low=0.1,
        delta_high=0.1,  # type: ignore[arg-type]
    )
    assert torch.equal(out.keep, keep)
    pi = torch.softmax(p.logits.double(), -1)
    ratio = pi.gather(-1, p.tokens[:, None]).squeeze(-1) / p.behavior.token_logprobs.double().exp()
    w = p.advantages.double() * ratio.clamp(max=cap) * keep * rmask
    onehot = torch.nn.functional.one_hot(p.tokens, 300).double()
    want = -(w[:, None] * (onehot - pi)) / rmask.sum()
    torch.testing.assert_close(logits.grad.double(), want, rtol=1e-4, atol=1e-7)
    if mask != "none":
        assert not keep.all(), "the setting must make the mask bite"


def test_stats_are_consistent_with_the_mask() -> None:
    p = positions(500, 200, k=20, gap=1.5, seed=2)
    out = policy_loss(
        logits=p.logits, tokens=p.tokens, behavior=p.behavior, advantages=p.advantages
    )
    s = out.stats
    assert s["masked_fraction"] == pytest.approx(float((~out.keep).float().mean()))
    pos, neg = p.advantages > 0, p.advantages < 0
    assert s["masked_fraction_pos"] == pytest.approx(float((~out.keep[pos]).float().mean()))
    assert s["masked_fraction_neg"] == pytest.approx(float((~out.keep[neg]).float().mean()))
    assert 0 < s["divergence_mean"] <= s["divergence_max"] <= 1
    assert 0 < s["direction_disagreement"] < 1
    assert s["entropy"] > 0 and s["ratio_mean"] > 0
    assert all(isinstance(v, float) for v in s.values())


def test_low_precision_logits_train() -> None:
    p = positions(64, 500, gap=1.0, seed=3)
    logits = p.logits.to(torch.bfloat16).requires_grad_()
    out = policy_loss(logits=logits, tokens=p.tokens, behavior=p.behavior, advantages=p.advantages)
    out.loss.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad.float()).all()
    assert torch.isfinite(out.loss)


def test_empty_response_mask_gives_zero_loss() -> None:
    p = positions(8, 50, seed=4)
    out = policy_loss(
        logits=p.logits.clone().requires_grad_(),
        tokens=p.tokens,
        behavior=p.behavior,
        advantages=p.advantages,
        response_mask=torch.zeros(8, dtype=torch.bool),
    )
    assert float(out.loss.detach()) == 0.0
    assert out.stats["masked_fraction"] == 0.0
