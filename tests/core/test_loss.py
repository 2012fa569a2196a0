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


def test_kl_gradient_is_the_closed_form_of_k3() -> None:
    """With zero advantages only the penalty is left: beta * mean_i k3_i, whose gradient in the
    logits is beta / N * (1 - exp(ref - log pi(a))) * (e_a - pi), the autograd-free closed form
    (masked positions count in neither the sum nor the mean)."""
    p = positions(64, 40, gap=1.0, seed=5)
    gen = torch.Generator().manual_seed(6)
    ref = torch.log_softmax(p.logits + torch.randn(64, 40, generator=gen), -1)
    ref_a = ref.gather(-1, p.tokens[:, None])[:, 0]
    rmask = torch.rand(64, generator=gen) > 0.25
    beta = 0.3
    logits = p.logits.clone().requires_grad_()
    out = policy_loss(
        logits=logits,
        tokens=p.tokens,
        behavior=p.behavior,
        advantages=torch.zeros(64),
        response_mask=rmask,
        ref_logprobs=ref_a,
        kl_beta=beta,
    )
    out.loss.backward()
    assert logits.grad is not None
    pi = torch.softmax(p.logits.double(), -1)
    logp_a = pi.gather(-1, p.tokens[:, None])[:, 0].log()
    d = ref_a.double() - logp_a
    k3 = d.exp() - d - 1
    n = rmask.sum()
    assert float(out.loss.detach()) == pytest.approx(float(beta * (k3 * rmask).sum() / n), rel=1e-5)
    assert out.stats["kl_ref"] == pytest.approx(float(k3[rmask].mean()), rel=1e-5)
    onehot = torch.nn.functional.one_hot(p.tokens, 40).double()
    want = beta / n * ((1 - d.exp()) * rmask)[:, None] * (onehot - pi)
    torch.testing.assert_close(logits.grad.double(), want, rtol=1e-4, atol=1e-8)
    # the trust-region mask does not touch the penalty: every unmasked response token pulls
    assert (logits.grad[rmask].abs().sum(-1) > 0).all()


def test_kl_is_zero_at_the_reference_and_beta_zero_changes_nothing() -> None:
    p = positions(32, 60, seed=7)
    own = torch.log_softmax(p.logits, -1).gather(-1, p.tokens[:, None])[:, 0]
    args = {"tokens": p.tokens, "behavior": p.behavior, "advantages": p.advantages}
    plain_logits = p.logits.clone().requires_grad_()
    plain = policy_loss(logits=plain_logits, **args)
    plain.loss.backward()
    off_logits = p.logits.clone().requires_grad_()
    off = policy_loss(logits=off_logits, ref_logprobs=own + 1.0, kl_beta=0.0, **args)
    off.loss.backward()
    assert torch.equal(off.loss, plain.loss)  # beta = 0: bit for bit
    assert off_logits.grad is not None and plain_logits.grad is not None
    assert torch.equal(off_logits.grad, plain_logits.grad)
    at_ref = policy_loss(logits=p.logits, ref_logprobs=own, kl_beta=1.0, **args)
    assert at_ref.stats["kl_ref"] == pytest.approx(0.0, abs=1e-7)
    assert float(at_ref.loss) == pytest.approx(float(plain.loss.detach()), abs=1e-7)
    with pytest.raises(ValueError, match="kl_beta > 0 needs ref_logprobs"):
        policy_loss(logits=p.logits, kl_beta=0.1, **args)


def test_normalizer_splits_a_batch_into_pieces_with_the_same_gradient() -> None:
    """Gradient accumulation: pieces that divide by the whole batch's token count sum to the
    gradient of the whole batch (the policy term and the penalty alike)."""
    p = positions(48, 30, seed=8)
    ref = torch.log_softmax(p.logits * 0.5, -1).gather(-1, p.tokens[:, None])[:, 0]
    whole_logits = p.logits.clone().requires_grad_()
    whole = policy_loss(
        logits=whole_logits,
        tokens=p.tokens,
        behavior=p.behavior,
        advantages=p.advantages,
        ref_logprobs=ref,
        kl_beta=0.2,
    )
    whole.loss.backward()
    split_logits = p.logits.clone().requires_grad_()
    total = 0.0
    for idx in torch.arange(48).chunk(3):
        keep = torch.zeros(48, dtype=torch.bool)
        keep[idx] = True
        part = policy_loss(
            logits=split_logits[idx],
            tokens=p.tokens[idx],
            behavior=p.behavior.select(keep),
            advantages=p.advantages[idx],
            ref_logprobs=ref[idx],
            kl_beta=0.2,
            normalizer=48.0,
        )
        part.loss.backward()
        total += float(part.loss.detach())
    assert total == pytest.approx(float(whole.loss.detach()), rel=1e-5)
    assert whole_logits.grad is not None and split_logits.grad is not None
    torch.testing.assert_close(split_logits.grad, whole_logits.grad, rtol=1e-5, atol=1e-8)
