"""Each trust-region mask against a hand-written reference of its rule, on random positions."""

from __future__ import annotations

import math

import pytest
import torch

from core import TrustRegion, trust_region_mask
from core.objective.behavior import BehaviorView
from core.objective.estimators import ESTIMATORS, KINDS
from core.objective.masks import MASKS, far_from_behavior, ratio_moves_away, trust_region
from core.objective.synthetic import Positions, positions
from tests.core.references import (
    autograd_change,
    exact_divergence_fn,
    lumped_divergence_fn,
)

DELTA_LOW, DELTA_HIGH = 0.1, 0.2


@pytest.fixture(params=[(400, 64, 1.5, 0), (200, 1000, 1.0, 1), (64, 8000, 2.0, 2)])
def pos(request: pytest.FixtureRequest) -> Positions:
    n, vocab, gap, seed = request.param
    return positions(n, vocab, k=20, gap=gap, seed=seed)


def _probs_a(p: Positions) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(p.logits.double(), -1).gather(-1, p.tokens[:, None]).squeeze(-1)
    return logp.exp(), p.behavior.token_logprobs.double().exp()


def _deltas(p: Positions) -> torch.Tensor:
    return torch.where(p.advantages > 0, DELTA_HIGH, DELTA_LOW).double()


def _mask(p: Positions, mask: str, kind: str = "tv", estimator: str = "topk") -> torch.Tensor:
    return trust_region_mask(
        logits=p.logits,
        behavior=p.behavior,
        tokens=p.tokens,
        advantages=p.advantages,
        region=TrustRegion(
            mask=mask,  # type: ignore[arg-type]
            kind=kind,  # type: ignore[arg-type]
            estimator=estimator,  # type: ignore[arg-type]
            delta_low=DELTA_LOW,
            delta_high=DELTA_HIGH,
        ),
    )


def _assert_same_away_from_boundary(
    keep: torch.Tensor, masked_ref: torch.Tensor, clear: torch.Tensor
) -> None:
    assert clear.float().mean() > 0.9
    assert masked_ref[clear].any() and (~masked_ref[clear]).any(), "reference must mask some"
    assert torch.equal(keep[clear], ~masked_ref[clear])


def test_ppo_clip_is_the_ratio_rule(pos: Positions) -> None:
    pi_a, mu_a = _probs_a(pos)
    r, a = pi_a / mu_a, pos.advantages
    masked = ((a > 0) & (r > 1 + DELTA_HIGH)) | ((a < 0) & (r < 1 - DELTA_LOW))
    clear = ((r - (1 + DELTA_HIGH)).abs() > 1e-5) & ((r - (1 - DELTA_LOW)).abs() > 1e-5)
    _assert_same_away_from_boundary(_mask(pos, "ppo_clip"), masked, clear)


def test_dppo_binary_tv_is_the_published_rule(pos: Positions) -> None:
    pi_a, mu_a = _probs_a(pos)
    a = pos.advantages
    masked = ((a > 0) & (pi_a - mu_a > DELTA_HIGH)) | ((a < 0) & (mu_a - pi_a > DELTA_LOW))
    clear = ((pi_a - mu_a).abs() - _deltas(pos)).abs() > 1e-6
    _assert_same_away_from_boundary(_mask(pos, "dppo", "tv", "binary"), masked, clear)


def test_dppo_binary_kl_is_the_published_rule(pos: Positions) -> None:
    pi_a, mu_a = _probs_a(pos)
    a = pos.advantages
    kl = mu_a * (mu_a / pi_a).log() + (1 - mu_a) * ((1 - mu_a) / (1 - pi_a)).log()
    masked = ((a > 0) & (pi_a > mu_a) & (kl > DELTA_HIGH)) | (
        (a < 0) & (pi_a < mu_a) & (kl > DELTA_LOW)
    )
    clear = (kl - _deltas(pos)).abs() > 1e-5
    _assert_same_away_from_boundary(_mask(pos, "dppo", "kl", "binary"), masked, clear)


@pytest.mark.parametrize("kind", KINDS)
def test_dppo_topk_uses_topk_divergence_and_ratio_direction(pos: Positions, kind: str) -> None:
    pi_a, mu_a = _probs_a(pos)
    a = pos.advantages
    d = lumped_divergence_fn(pos.behavior, pos.tokens, kind, "topk")(pos.logits.double())
    away = ((a > 0) & (pi_a > mu_a)) | ((a < 0) & (pi_a < mu_a))
    masked = away & (d > _deltas(pos))
    clear = (d - _deltas(pos)).abs() > 1e-5
    _assert_same_away_from_boundary(_mask(pos, "dppo", kind, "topk"), masked, clear)


@pytest.mark.parametrize("kind", KINDS)
def test_predictive_exact_is_divergence_and_autograd_direction(pos: Positions, kind: str) -> None:
    fn = exact_divergence_fn(pos.behavior, kind)
    d = fn(pos.logits.double())
    g = autograd_change(fn, pos.logits, pos.tokens, pos.advantages)
    masked = (d > _deltas(pos)) & (g > 0)
    clear = ((d - _deltas(pos)).abs() > 1e-5) & (g.abs() > 1e-7)
    _assert_same_away_from_boundary(_mask(pos, "predictive", kind, "exact"), masked, clear)


@pytest.mark.parametrize("kind", KINDS)
def test_predictive_binary_equals_dppo_binary(pos: Positions, kind: str) -> None:
    """On the two-category view the predictive direction is DPPO's ratio rule
    (docs/developers/design.md#the-two-category-view)."""
    pi_a, mu_a = _probs_a(pos)
    clear = (pi_a - mu_a).abs() > 1e-5
    keep_pred = _mask(pos, "predictive", kind, "binary")
    keep_dppo = _mask(pos, "dppo", kind, "binary")
    assert torch.equal(keep_pred[clear], keep_dppo[clear])


def test_predictive_and_dppo_differ_on_full_distributions() -> None:
    """They must not collapse into one rule once the rest of the distribution is seen."""
    p = positions(2000, 2000, k=20, gap=1.5, seed=4)
    keep_pred = _mask(p, "predictive", "tv", "exact")
    keep_dppo = _mask(p, "dppo", "tv", "exact")
    assert (keep_pred != keep_dppo).float().mean() > 0.01


def test_none_keeps_everything(pos: Positions) -> None:
    assert _mask(pos, "none").all()


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_zero_advantage_tokens_keep_their_gradient(mask: str, estimator: str) -> None:
    p = positions(300, 100, gap=3.0, seed=5)
    p = Positions(p.logits, p.behavior, p.tokens, torch.zeros_like(p.advantages))
    for kind in KINDS:
        assert _mask(p, mask, kind, estimator).all()


def test_unknown_mask_and_negative_delta_are_rejected() -> None:
    p = positions(4, 30, seed=0)
    with pytest.raises(ValueError, match="mask must be one of"):
        _mask(p, "trpo")
    with pytest.raises(ValueError, match=r"delta_low=-0\.1"):
        trust_region_mask(
            p.logits, p.behavior, p.tokens, p.advantages, TrustRegion(mask="dppo", delta_low=-0.1)
        )
    # a delta of 0 is a region of width 0, not an error: every token the default masks, and more
    q = positions(400, 60, gap=0.3, seed=11)
    dppo = TrustRegion(mask="dppo")
    default = trust_region_mask(q.logits, q.behavior, q.tokens, q.advantages, dppo)
    zero = trust_region_mask(
        q.logits,
        q.behavior,
        q.tokens,
        q.advantages,
        TrustRegion(mask="dppo", delta_low=0.0, delta_high=0.0),
    )
    assert not (zero & ~default).any()
    assert int((~zero).sum()) > int((~default).sum())


def test_default_deltas_are_the_documented_0_15() -> None:
    """`trust_region_mask` without deltas is DPPO's published default, 0.15 on both sides (the
    table in docs/developers/design.md#trust-region-masks and the spec's defaults): a changed
    default would silently widen the region of every caller of the public function."""
    p = positions(400, 60, gap=3.0, seed=11)
    dppo = TrustRegion(mask="dppo")
    default = trust_region_mask(p.logits, p.behavior, p.tokens, p.advantages, dppo)
    explicit = trust_region_mask(
        p.logits,
        p.behavior,
        p.tokens,
        p.advantages,
        TrustRegion(mask="dppo", delta_low=0.15, delta_high=0.15),
    )
    wider = trust_region_mask(
        p.logits,
        p.behavior,
        p.tokens,
        p.advantages,
        TrustRegion(mask="dppo", delta_low=1.15, delta_high=1.15),
    )
    assert torch.equal(default, explicit)
    assert not torch.equal(default, wider)  # the case tells 0.15 from a wider delta
    # and `trust_region`, which the trainer and the fused loss call, defaults alike
    region = trust_region(p.logits, p.behavior, p.tokens, p.advantages, dppo)
    assert torch.equal(region.keep, default)


def test_ratio_direction_at_its_boundaries() -> None:
    """DPPO's direction rule moves away only with A > 0 and r > 1, or A < 0 and r < 1: a token
    exactly at r = 1, or with A = 0, moves nowhere (it feeds masked_only_dppo and the
    disagreement statistics as well as the mask)."""
    log_ratio = torch.tensor([0.0, 0.0, 0.1, -0.1, 0.1, -0.1, -0.1, 0.1, 0.0])
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 1.0, -1.0, 0.0])
    want = [False, False, True, True, False, False, False, False, False]
    assert ratio_moves_away(log_ratio, advantages).tolist() == want


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("kind", KINDS)
def test_predictive_keeps_a_far_token_whose_step_cannot_move_the_divergence(
    kind: str, estimator: str
) -> None:
    """The predictive mask masks a far token only where its step would increase D (g > 0). A
    token pi has saturated (logit margin 200: pi(a) is exactly 1 in fp32) has a zero gradient,
    so g is exactly 0 while D to a uniform mu is far past 0.15: kept, and not counted in the
    masked fractions, with either sign of A."""
    v = 6
    logits = torch.tensor([[200.0] + [0.0] * (v - 1)] * 2)
    tokens = torch.tensor([0, 0])
    advantages = torch.tensor([1.0, -1.0])
    mu = torch.full((2, v), -math.log(v))
    view = BehaviorView(mu[:, 0].clone(), torch.tensor([[0, 1, 2]] * 2), mu[:, :3].clone(), mu)
    predictive = TrustRegion(mask="predictive", kind=kind, estimator=estimator)  # type: ignore[arg-type]
    region = trust_region(logits, view, tokens, advantages, predictive)
    assert region.divergence is not None and region.change is not None
    assert (region.divergence > 0.5).all()
    assert region.change.tolist() == [0.0, 0.0]
    assert region.keep.tolist() == [True, True]


def test_far_from_behavior_is_strictly_past_the_threshold_of_the_advantage_sign() -> None:
    """D must exceed delta_high where A > 0 and delta_low where A < 0 (a token exactly at the
    threshold is inside the region), and a token with A = 0 is never far. No caller shows the
    A = 0 rule today (such a token never moves away either: its ratio rule and its g are both
    'not away'), so the helper's own contract is held here. Deltas 0.125 and 0.25 are exact in
    fp32."""
    advantages = torch.tensor([0.0, 0.5, -0.5, 0.5, 0.5, -0.5, -0.5, -0.5, 0.5])
    divergence = torch.tensor([1.0, 1.0, 1.0, 0.25, 0.26, 0.125, 0.13, 0.2, 0.2])
    want = [False, True, True, False, True, False, True, True, False]
    deltas = TrustRegion(delta_low=0.125, delta_high=0.25)
    assert far_from_behavior(divergence, advantages, deltas).tolist() == want


def test_ppo_clip_keeps_a_ratio_exactly_at_its_bounds() -> None:
    """PPO clips a ratio beyond 1 + delta_high (A > 0) or below 1 - delta_low (A < 0), not one
    at the bound. The behavior log-probabilities are picked so that the fp32 ratio lands exactly
    on 1.25 and 0.75 (checked), then the nearest fp32 values past each."""
    logits = torch.zeros(6, 2)  # pi(a) = 1/2 everywhere
    logp_a = torch.log_softmax(logits, -1)[:, 0]
    want_ratio = torch.tensor([1.25, 0.75])
    mu = logp_a[:2] - torch.log(want_ratio)
    for _ in range(8):  # walk mu by fp32 ulps until exp(logp_a - mu) is the bound exactly
        ratio = (logp_a[:2] - mu).exp()
        mu = torch.where(ratio > want_ratio, torch.nextafter(mu, mu + 1), mu)
        mu = torch.where(ratio < want_ratio, torch.nextafter(mu, mu - 1), mu)
    assert torch.equal((logp_a[:2] - mu).exp(), want_ratio)
    past = mu.clone()
    while not ((logp_a[0] - past[0]).exp() > 1.25 and (logp_a[1] - past[1]).exp() < 0.75):
        past = torch.stack(
            [torch.nextafter(past[0], past[0] - 1), torch.nextafter(past[1], past[1] * 0)]
        )
    behavior_lp = torch.cat([mu, past, mu])
    tokens = torch.zeros(6, dtype=torch.long)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])
    full = torch.log_softmax(logits, -1)
    view = BehaviorView(behavior_lp, tokens[:, None], behavior_lp[:, None], full)
    region = trust_region(
        logits,
        view,
        tokens,
        advantages,
        TrustRegion(mask="ppo_clip", delta_low=0.25, delta_high=0.25),
    )
    ratio = region.log_ratio.exp()
    assert ratio[:2].tolist() == [1.25, 0.75] and ratio[2] > 1.25 and ratio[3] < 0.75
    # at the bounds: kept; just past: clipped; a ratio on the other side of 1: kept
    assert region.keep.tolist() == [True, True, False, False, True, True]


def test_trust_region_holds_no_graph_and_computes_d_only_when_asked() -> None:
    """The mask is a decision, not a loss term: with logits that require grad it returns tensors
    without a graph (so the activations of its full-vocabulary passes are freed at once), and
    a ratio mask computes D and g only with `always_estimate` (the default skips that pass)."""
    p = positions(50, 40, gap=1.0, seed=3)
    logits = p.logits.clone().requires_grad_()
    for mask in MASKS:
        kl = TrustRegion(mask=mask, kind="kl")  # type: ignore[arg-type]
        region = trust_region(logits, p.behavior, p.tokens, p.advantages, kl)
        assert not region.log_ratio.requires_grad
        estimated = mask in ("dppo", "predictive")
        assert (region.divergence is not None) == estimated, mask
        assert (region.change is not None) == estimated, mask
        if region.divergence is not None and region.change is not None:
            assert not region.divergence.requires_grad and not region.change.requires_grad
    clip = TrustRegion(mask="ppo_clip", kind="kl")
    asked = trust_region(logits, p.behavior, p.tokens, p.advantages, clip, always_estimate=True)
    assert asked.divergence is not None and asked.change is not None


def test_a_negative_delta_high_is_rejected_like_a_negative_delta_low() -> None:
    p = positions(4, 30, seed=0)
    with pytest.raises(ValueError, match=r"delta_high=-0\.1"):
        trust_region_mask(
            p.logits, p.behavior, p.tokens, p.advantages, TrustRegion(mask="dppo", delta_high=-0.1)
        )
