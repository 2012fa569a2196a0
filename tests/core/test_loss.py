"""The masked policy loss: its gradient, aggregation, truncation and logged statistics."""

from __future__ import annotations

import math

import pytest
import torch

from core import TrustRegion, policy_loss, trust_region_mask
from core.objective.loss import DIRECTION_TOLERANCE
from core.objective.masks import MASKS, trust_region
from core.objective.synthetic import Positions, positions, topk_view
from core.training.update import loss_normalizer


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
        region=TrustRegion(mask=mask, delta_low=0.1, delta_high=0.1, is_cap=cap),  # type: ignore[arg-type]
        response_mask=rmask,
    )
    out.loss.backward()
    assert logits.grad is not None

    keep = trust_region_mask(
        p.logits,
        p.behavior,
        p.tokens,
        p.advantages,
        TrustRegion(mask=mask, delta_low=0.1, delta_high=0.1),  # type: ignore[arg-type]
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


def test_a_single_response_token_is_its_own_mean() -> None:
    """token_mean over one response token is that token's term, not a fraction of it: on-policy
    (mu = pi) with mask none the loss is -A * log pi(a) of the one token the mask keeps."""
    p = positions(8, 50, seed=4)
    logp = torch.log_softmax(p.logits, -1).gather(-1, p.tokens[:, None])[:, 0]
    view = p.behavior
    behavior = type(view)(logp, view.topk_ids, view.topk_logprobs)
    only = torch.zeros(8, dtype=torch.bool)
    only[3] = True
    out = policy_loss(
        p.logits, p.tokens, behavior, p.advantages, TrustRegion(mask="none"), response_mask=only
    )
    assert float(out.loss) == pytest.approx(float(-p.advantages[3] * logp[3]), rel=1e-6)


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
    # no response token: every statistic is 0, not a sentinel (they are averaged across steps)
    assert len(out.stats) == 14 and set(out.stats.values()) == {0.0}, out.stats


def test_negative_kl_beta_and_cap_are_rejected() -> None:
    """A negative β would reward drifting from the reference; a cap <= 0 zeroes every weight."""
    p = positions(8, 50, seed=4)
    args = dict(logits=p.logits, tokens=p.tokens, behavior=p.behavior, advantages=p.advantages)
    ref = p.behavior.token_logprobs
    with pytest.raises(ValueError, match=r"kl_beta must be >= 0, got -0\.5"):
        policy_loss(**args, region=TrustRegion(kl_beta=-0.5), ref_logprobs=ref)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"is_cap must be > 0, got 0\.0"):
        policy_loss(**args, region=TrustRegion(is_cap=0.0))  # type: ignore[arg-type]


def test_a_cap_below_one_is_allowed_and_caps_every_weight() -> None:
    """Any cap > 0 is valid: with cap 0.5 and every ratio above it (mu's token log-probs set far
    below pi's), each kept token's weight is exactly 0.5, so the loss is 0.5 times the uncapped
    surrogate with unit weights."""
    p = positions(16, 30, seed=4)
    logp = torch.log_softmax(p.logits, -1).gather(-1, p.tokens[:, None])[:, 0]
    view = p.behavior
    behavior = type(view)(logp - 3.0, view.topk_ids, view.topk_logprobs)  # ratio e^3 > 0.5
    out = policy_loss(
        p.logits, p.tokens, behavior, p.advantages, TrustRegion(mask="none", is_cap=0.5)
    )
    want = -(0.5 * p.advantages * logp).mean()
    assert float(out.loss) == pytest.approx(float(want), rel=1e-6)


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
        region=TrustRegion(kl_beta=beta),
        response_mask=rmask,
        ref_logprobs=ref_a,
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


@pytest.mark.parametrize("gap", [1.0, 100.0])
def test_kl_is_zero_at_the_reference_and_beta_zero_changes_nothing(gap: float) -> None:
    """With kl_beta = 0 the penalty stays out of the loss, not in it times 0: at a gap of 100
    nats k3 = expm1(100) - 100 overflows fp32 (a token the policy has all but ruled out and
    the reference has not), and 0 * inf would make the loss NaN."""
    p = positions(32, 60, seed=7)
    own = torch.log_softmax(p.logits, -1).gather(-1, p.tokens[:, None])[:, 0]
    args = {"tokens": p.tokens, "behavior": p.behavior, "advantages": p.advantages}
    plain_logits = p.logits.clone().requires_grad_()
    plain = policy_loss(logits=plain_logits, **args)
    plain.loss.backward()
    off_logits = p.logits.clone().requires_grad_()
    off = policy_loss(
        logits=off_logits, region=TrustRegion(kl_beta=0.0), ref_logprobs=own + gap, **args
    )
    off.loss.backward()
    assert torch.equal(off.loss, plain.loss)  # beta = 0: bit for bit
    assert off_logits.grad is not None and plain_logits.grad is not None
    assert torch.equal(off_logits.grad, plain_logits.grad)
    at_ref = policy_loss(logits=p.logits, region=TrustRegion(kl_beta=1.0), ref_logprobs=own, **args)
    assert at_ref.stats["kl_ref"] == pytest.approx(0.0, abs=1e-7)
    assert float(at_ref.loss) == pytest.approx(float(plain.loss.detach()), abs=1e-7)
    with pytest.raises(ValueError, match="kl_beta > 0 needs ref_logprobs"):
        policy_loss(logits=p.logits, region=TrustRegion(kl_beta=0.1), **args)


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
        region=TrustRegion(kl_beta=0.2),
        ref_logprobs=ref,
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
            region=TrustRegion(kl_beta=0.2),
            ref_logprobs=ref[idx],
            normalizer=48.0,
        )
        part.loss.backward()
        total += float(part.loss.detach())
    assert total == pytest.approx(float(whole.loss.detach()), rel=1e-5)
    assert whole_logits.grad is not None and split_logits.grad is not None
    torch.testing.assert_close(split_logits.grad, whole_logits.grad, rtol=1e-5, atol=1e-8)


# -- telemetry: direction rules compared only where D means something ----------------------


@pytest.mark.parametrize("estimator", ["binary", "topk", "exact", "topk_tail"])
@pytest.mark.parametrize("kind", ["tv", "kl", "kl_reverse"])
def test_on_policy_positions_compare_no_directions(kind: str, estimator: str) -> None:
    """mu = pi exactly (gap 0), logits at language-model magnitude: D is rounding, below the
    tolerance everywhere, so the rules are never compared (comparing every sign read ~30%)."""
    p = positions(512, 2000, k=20, gap=0.0, peak=2.0, seed=3)
    out = policy_loss(
        logits=p.logits + 40.0,
        tokens=p.tokens,
        behavior=p.behavior,
        advantages=p.advantages,
        region=TrustRegion(kind=kind, estimator=estimator),  # type: ignore[arg-type]
    )
    s = out.stats
    assert s["divergence_max"] < DIRECTION_TOLERANCE / 50
    assert s["direction_disagreement"] == s["direction_disagreement_far"] == 0.0
    assert s["masked_only_predictive"] == s["masked_only_dppo"] == s["masked_fraction"] == 0.0
    assert s["ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def _region(p: Positions, delta: float) -> tuple[torch.Tensor, ...]:
    """D, the two 'moves away' rules and 'far', by hand from the trust region's ingredients."""
    none = TrustRegion(mask="none")
    r = trust_region(p.logits, p.behavior, p.tokens, p.advantages, none, always_estimate=True)
    assert r.divergence is not None and r.change is not None
    pos, neg = p.advantages > 0, p.advantages < 0
    ratio_away = (pos & (r.log_ratio > 0)) | (neg & (r.log_ratio < 0))
    change_away = r.change > 0
    far = (pos | neg) & (r.divergence > delta)
    return r.divergence, ratio_away, change_away, far, pos | neg


def test_disagreement_and_mask_differences_have_their_definitions() -> None:
    """Off-policy positions where every quantity is non-trivial: each metric against its
    definition, and the same values whichever mask is configured (one pass, no extra work)."""
    p = positions(2000, 300, k=20, gap=0.6, seed=11)
    delta = 0.1
    d, ratio_away, change_away, far, signed = _region(p, delta)
    disagree = ratio_away != change_away
    n_signed = float(signed.sum())
    want = {
        "direction_disagreement": float((disagree & (d > DIRECTION_TOLERANCE)).sum()) / n_signed,
        "direction_disagreement_far": float((disagree & far).sum()) / n_signed,
        "masked_only_predictive": float((far & change_away & ~ratio_away).float().mean()),
        "masked_only_dppo": float((far & ratio_away & ~change_away).float().mean()),
    }
    assert all(v > 0.01 for v in want.values()), want
    # the tolerance matters here: some disagreeing tokens have D below it, and are not counted
    assert want["direction_disagreement"] < float(disagree[signed].float().mean())
    masked = {}
    for mask in MASKS:
        out = policy_loss(
            logits=p.logits,
            tokens=p.tokens,
            behavior=p.behavior,
            advantages=p.advantages,
            region=TrustRegion(mask=mask, delta_low=delta, delta_high=delta),  # type: ignore[arg-type]
        )
        for k, v in want.items():
            assert out.stats[k] == pytest.approx(v, abs=1e-7), (mask, k)
        masked[mask] = out.stats["masked_fraction"]
    # the two masks differ by exactly the two set differences
    only = want["masked_only_predictive"] - want["masked_only_dppo"]
    assert masked["predictive"] - masked["dppo"] == pytest.approx(only, abs=1e-6)


def test_disagreement_tolerance_in_a_hand_built_case() -> None:
    """V = 3, pi = (0.1, 0.8, 0.1), the sampled token 0 with A = +1, and mu = pi + t (-1, -1, 2):
    TV = 2t, pi_a > mu_a (DPPO: the step moves away), yet the step's predicted TV change is
    negative (most of the mass it takes comes from token 1, where pi > mu). The three rows
    have t = 1e-5, 0.01, 0.1: D = 2e-5 (below the tolerance: not compared), 0.02 (compared),
    0.2 (compared, and past delta = 0.05: DPPO masks it, the predictive mask does not)."""
    pi = torch.tensor([0.1, 0.8, 0.1], dtype=torch.float64)
    ts = torch.tensor([1e-5, 0.01, 0.1], dtype=torch.float64)
    mu = pi + ts[:, None] * torch.tensor([-1.0, -1.0, 2.0], dtype=torch.float64)
    logits = pi.log().expand(3, 3).float().contiguous()
    tokens = torch.zeros(3, dtype=torch.long)
    view = topk_view(mu.log().float(), tokens, 3)
    adv = torch.ones(3)
    exact = TrustRegion(mask="none", estimator="exact")
    r = trust_region(logits, view, tokens, adv, exact, always_estimate=True)
    assert r.divergence is not None and r.change is not None
    torch.testing.assert_close(r.divergence.double(), 2 * ts, rtol=1e-4, atol=1e-7)
    # g = A/2 [pi_a (s_a - sbar) - sum_j pi_j^2 (s_j - sbar)], s = sign(pi - mu) = (1, 1, -1),
    # sbar = 0.1 + 0.8 - 0.1 = 0.8: g = 0.5 [0.1 * 0.2 - (0.01 * 0.2 + 0.64 * 0.2 - 0.01 * 1.8)]
    g = 0.5 * (0.1 * 0.2 - (0.01 * 0.2 + 0.64 * 0.2 - 0.01 * 1.8))
    assert g == pytest.approx(-0.046)
    torch.testing.assert_close(r.change.double(), torch.full((3,), g, dtype=torch.float64))
    assert (r.log_ratio > 0).all()  # DPPO's direction: away, on every row
    for mask, masked in [("predictive", 0.0), ("dppo", 1 / 3)]:
        out = policy_loss(
            logits=logits,
            tokens=tokens,
            behavior=view,
            advantages=adv,
            region=TrustRegion(mask=mask, estimator="exact", delta_low=0.05, delta_high=0.05),  # type: ignore[arg-type]
        )
        assert out.stats == pytest.approx(
            out.stats
            | {
                "direction_disagreement": 2 / 3,
                "direction_disagreement_far": 1 / 3,
                "masked_only_predictive": 0.0,
                "masked_only_dppo": 1 / 3,
                "masked_fraction": masked,
            }
        )


# -- loss aggregation ------------------------------------------------------------------------


def test_loss_normalizers_by_hand() -> None:
    """4 sequences of 1, 3, 2 and 1 response tokens (7 in all) in 2 minibatches of 2:
    {0, 1} holds 4 tokens, {2, 3} holds 3."""
    rmask = torch.tensor(
        [[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.bool
    )  # (B=4, T=3)
    first, second = torch.tensor([0, 1]), torch.tensor([2, 3])
    # token_mean: 7 / 2 = 3.5 tokens per minibatch, every token of the step weighs 1 / 7 * 2
    assert loss_normalizer("token_mean", rmask, first, 2, 1) == 3.5
    assert loss_normalizer("token_mean", rmask, second, 2, 2) == 3.5
    # one minibatch in one piece: the piece's own count, policy_loss's default path
    assert loss_normalizer("token_mean", rmask, torch.arange(4), 1, 1) is None
    assert loss_normalizer("token_mean", rmask, torch.arange(4), 1, 2) == 7.0
    # minibatch_token_mean: each minibatch by its own count
    assert loss_normalizer("minibatch_token_mean", rmask, first, 2, 1) is None
    assert loss_normalizer("minibatch_token_mean", rmask, first, 2, 2) == 4.0
    assert loss_normalizer("minibatch_token_mean", rmask, second, 2, 2) == 3.0
    # seq_mean: length times the minibatch's 2 sequences, per sequence of the batch
    per_seq = loss_normalizer("seq_mean", rmask, first, 2, 1)
    assert isinstance(per_seq, torch.Tensor)
    assert per_seq.tolist() == [2.0, 6.0, 4.0, 2.0]
    with pytest.raises(ValueError, match="loss_agg"):
        loss_normalizer("sum", rmask, first, 2, 1)  # type: ignore[arg-type]


def test_loss_aggregations_by_hand() -> None:
    """Two sequences of 2 and 3 tokens, A = 1 and 0.5, on-policy over V = 2 uniform logits
    (log pi(a) = -ln 2, ratio 1): loss = ln 2 * sum_i A_i / normalizer_i.

    token mean: ln 2 (2 * 1 + 3 * 0.5) / 5 = 0.7 ln 2; sequence mean: ln 2 (1 + 0.5) / 2 =
    0.75 ln 2; one minibatch's own count, pieces {seq 1} and {seq 2} each divided by 5: the
    token mean again, summed over the pieces."""
    n = 5
    logits = torch.zeros(n, 2)
    tokens = torch.tensor([0, 1, 0, 1, 1])
    logmu = torch.full((n, 2), -math.log(2.0))
    view = topk_view(logmu, tokens, 2)
    adv = torch.tensor([1.0, 1.0, 0.5, 0.5, 0.5])
    args = {"tokens": tokens, "behavior": view, "advantages": adv}
    ln2 = math.log(2.0)
    token_mean = policy_loss(logits=logits, **args)
    assert float(token_mean.loss) == pytest.approx(0.7 * ln2, rel=1e-6)
    rmask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    per_seq = loss_normalizer("seq_mean", rmask, torch.arange(2), 1, 1)
    assert isinstance(per_seq, torch.Tensor)
    per_token = per_seq[:, None].expand_as(rmask)[rmask]  # as core.training.update expands it
    assert per_token.tolist() == [4.0, 4.0, 6.0, 6.0, 6.0]
    seq_mean = policy_loss(logits=logits, normalizer=per_token, **args)
    assert float(seq_mean.loss) == pytest.approx(0.75 * ln2, rel=1e-6)
    keep = torch.tensor([True, True, False, False, False])
    pieces = [
        policy_loss(
            logits=logits[idx],
            tokens=tokens[idx],
            behavior=view.select(idx),
            advantages=adv[idx],
            normalizer=5.0,
        ).loss
        for idx in (keep, ~keep)
    ]
    assert float(sum(pieces)) == pytest.approx(0.7 * ln2, rel=1e-6)
    with pytest.raises(ValueError, match="normalizer must be"):
        policy_loss(logits=logits, normalizer=per_token[:3], **args)
    # tokens outside the response add nothing, whatever the normalizer: the third token (A = 0.5)
    # left out gives ln 2 (1 + 1 + 0.5 + 0.5) / 5 and ln 2 (1/4 + 1/4 + 0.5/6 + 0.5/6)
    held = torch.tensor([True, True, False, True, True])
    by_count = policy_loss(logits=logits, normalizer=5.0, response_mask=held, **args)
    assert float(by_count.loss) == pytest.approx(0.6 * ln2, rel=1e-6)
    by_sequence = policy_loss(logits=logits, normalizer=per_token, response_mask=held, **args)
    assert float(by_sequence.loss) == pytest.approx((2 / 3) * ln2, rel=1e-6)


def test_the_importance_weight_cap_defaults_to_1e4() -> None:
    """A token 20000 times likelier under pi than under mu is weighted by the cap, 1e4 by
    default (the documented value): its loss is -A * 1e4 * log pi(a) / 1, told apart from a
    cap of 10001 in fp32. Mask `none`, so only the cap acts."""
    logits = torch.tensor([[0.0, 0.0]])  # pi(a) = 1/2
    tokens = torch.tensor([0])
    logmu = torch.log(torch.tensor([[0.5 / 20000, 1 - 0.5 / 20000]]))
    args = {"tokens": tokens, "behavior": topk_view(logmu, tokens, 2)}
    adv = torch.tensor([1.0])
    none = TrustRegion(mask="none")
    default = policy_loss(logits=logits, advantages=adv, region=none, **args)  # type: ignore[arg-type]
    assert float(default.log_ratio.exp()) == pytest.approx(20000, rel=1e-4)
    assert float(default.loss) == pytest.approx(1e4 * math.log(2.0), rel=1e-6)
    capped = TrustRegion(mask="none", is_cap=10001.0)
    other = policy_loss(logits=logits, advantages=adv, region=capped, **args)  # type: ignore[arg-type]
    assert float(other.loss) != pytest.approx(float(default.loss), rel=1e-6)


def test_outside_topk_counts_sampled_tokens_below_pis_kth_logit_on_both_paths() -> None:
    """Four tokens over a vocabulary of 10 with distinct logits, the sampled token ranked 0, 2,
    3 and 9 by pi, a view of K = 3: the last two lie outside pi's top-3, a fraction of 1/2.
    The fused path (hidden states times an identity projection: the same logits) agrees."""
    from core import fused_policy_loss
    from core.objective.behavior import BehaviorView
    from core.objective.lazy_logits import ProjectedLogits

    torch.manual_seed(0)
    logits = torch.randn(4, 10).sort(dim=-1, descending=True).values  # column j has rank j
    logits = logits[:, torch.randperm(10)]  # ranks shuffled across columns, row by row alike
    order = logits.argsort(dim=-1, descending=True)  # (4, 10): the id of each rank
    tokens = order[torch.arange(4), torch.tensor([0, 2, 3, 9])]
    logp = torch.log_softmax(logits, dim=-1)
    view = BehaviorView(
        logp.gather(-1, tokens[:, None])[:, 0],
        order[:, :3].clone(),
        logp.gather(-1, order[:, :3]),
    )
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    out = policy_loss(logits, tokens, view, adv)
    assert out.stats["outside_topk"] == 0.5
    fused = fused_policy_loss(ProjectedLogits(logits, torch.eye(10)), tokens, view, adv)
    assert fused.stats["outside_topk"] == 0.5
    wider = BehaviorView(view.token_logprobs, order[:, :4].clone(), logp.gather(-1, order[:, :4]))
    assert policy_loss(logits, tokens, wider, adv).stats["outside_topk"] == 0.25  # K = 4
    # fewer tokens than K (2 < 3): K still counts columns of the vocabulary, not rows
    two = policy_loss(logits[1:3], tokens[1:3], view.select(torch.arange(1, 3)), adv[1:3])
    assert two.stats["outside_topk"] == 0.5  # ranks 2 and 3: the first inside the top-3


def test_statistics_over_one_token_and_tokens_without_advantage() -> None:
    """A statistic over a single token is that token's value; tokens with A = 0 count in no
    conditional statistic (masked_fraction_pos/neg, the direction disagreements: their
    denominators are the A > 0, A < 0 and A != 0 tokens); a saturated token (pi(a) = 1 in
    fp32, so its step cannot move D: g = 0 exactly) is no disagreement with the ratio rule
    when A < 0 and pi(a) > mu(a), though D is far: ratio rule 'toward', g 'not away'."""
    v = 6
    logits = torch.zeros(5, v)
    logits[4, 0] = 200.0  # row 4: pi(a) = 1
    tokens = torch.zeros(5, dtype=torch.long)
    mu = torch.full((5, v), -math.log(v))
    view = topk_view(mu, tokens, 3)
    adv = torch.tensor([1.0, 0.0, -1.0, 0.0, -1.0])
    binary = TrustRegion(mask="predictive", kind="tv", estimator="binary")
    out = policy_loss(logits, tokens, view, adv, binary)
    assert out.counts["masked_fraction_pos"] == 1.0
    assert out.counts["masked_fraction_neg"] == 2.0
    assert out.counts["direction_disagreement"] == 3.0
    assert out.stats["direction_disagreement"] == 0.0
    assert out.stats["masked_only_predictive"] == 0.0
    one = torch.tensor([False, False, True, False, False])
    single = policy_loss(logits, tokens, view, adv, response_mask=one)
    assert single.stats["ratio_mean"] == pytest.approx(1.0, rel=1e-6)  # pi = mu there
    assert single.stats["entropy"] == pytest.approx(math.log(v), rel=1e-6)
