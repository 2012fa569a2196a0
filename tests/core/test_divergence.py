"""Property tests of the divergence estimators and their predicted change
(docs/developers/design.md#estimators, docs/developers/design.md#the-predicted-direction)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from core import BehaviorView, divergence, predicted_change
from core.objective.estimators import (
    ESTIMATORS,
    KINDS,
    LOG_FLOOR,
    _category_terms,
    _view_categories,
    divergence_and_change,
    estimator_stats,
    softmax_stats,
)
from core.objective.lazy_logits import GatheredLogits
from core.objective.synthetic import Positions, positions, topk_view
from core.objective.truncation import truncate_to_nucleus
from core.rollout import sampling_logprobs
from tests.core.allocations import Allocations
from tests.core.references import (
    autograd_change,
    exact_divergence_fn,
    finite_step_change,
    lumped_divergence_fn,
)

# (n, vocab, peak, gap, seed): flat to peaked, near to far off-policy, vocabularies up to 32k.
CASES = [
    (64, 8, 0.3, 0.5, 0),
    (64, 50, 1.0, 0.1, 1),
    (48, 512, 0.3, 1.0, 2),
    (48, 512, 3.0, 0.3, 3),
    (32, 4096, 1.0, 0.5, 4),
    (16, 32000, 1.0, 0.2, 5),
    (16, 32000, 2.5, 1.0, 6),
]
CASE_IDS = [f"n{c[0]}-v{c[1]}-peak{c[2]}-gap{c[3]}" for c in CASES]


@pytest.fixture(params=CASES, ids=CASE_IDS)
def pos(request: pytest.FixtureRequest) -> Positions:
    n, vocab, peak, gap, seed = request.param
    return positions(n, vocab, k=20, gap=gap, peak=peak, seed=seed)


def _scale(p: Positions) -> torch.Tensor:
    """The natural size of g's terms, |A| (pi_a + sum pi^2): errors are judged against it."""
    pi = torch.softmax(p.logits.double(), dim=-1)
    pi_a = pi.gather(-1, p.tokens.unsqueeze(-1)).squeeze(-1)
    return p.advantages.double().abs() * (pi_a + (pi * pi).sum(-1))


@pytest.mark.parametrize("kind", KINDS)
def test_exact_change_matches_autograd(pos: Positions, kind: str) -> None:
    got = predicted_change(
        pos.logits, pos.behavior, pos.tokens, pos.advantages, kind=kind, estimator="exact"
    ).double()
    want = autograd_change(
        exact_divergence_fn(pos.behavior, kind), pos.logits, pos.tokens, pos.advantages
    )
    scale = _scale(pos)
    # relative error <= 1e-4 where g is not tiny next to its own terms (where it is, fp32
    # cancellation between them is the limit): absolute error against the terms' size elsewhere,
    # 1e-5 of it (~80 float32 ulps: a 32k-term reduction in fp32 whose order depends on the CPU's
    # vector width; 1.35e-6 measured on AMD EPYC, while a wrong term is off by the whole size)
    not_tiny = want.abs() > 1e-3 * scale
    assert not_tiny.float().mean() > 0.5
    rel = (got - want).abs() / want.abs()
    assert rel[not_tiny].max() <= 1e-4, f"max rel err {rel[not_tiny].max():.2e}"
    assert ((got - want).abs() <= 1e-5 * scale + 1e-12).all()


@pytest.mark.parametrize("kind", KINDS)
def test_exact_change_predicts_sign_of_a_small_step(pos: Positions, kind: str) -> None:
    g = predicted_change(
        pos.logits, pos.behavior, pos.tokens, pos.advantages, kind=kind, estimator="exact"
    ).double()
    fn = exact_divergence_fn(pos.behavior, kind)
    step = finite_step_change(fn, pos.logits, pos.tokens, pos.advantages, eps=1e-5)
    clear = g.abs() > 1e-3 * _scale(pos)
    assert (torch.sign(step[clear]) == torch.sign(g[clear])).all()


@pytest.mark.parametrize("estimator", ["binary", "topk"])
@pytest.mark.parametrize("kind", KINDS)
def test_lumped_change_matches_autograd_of_lumped_divergence(
    pos: Positions, kind: str, estimator: str
) -> None:
    got = predicted_change(
        pos.logits, pos.behavior, pos.tokens, pos.advantages, kind=kind, estimator=estimator
    ).double()
    fn = lumped_divergence_fn(pos.behavior, pos.tokens, kind, estimator)
    want = autograd_change(fn, pos.logits, pos.tokens, pos.advantages)
    scale = _scale(pos)
    assert ((got - want).abs() <= 1e-4 * want.abs() + 1e-5 * scale + 1e-12).all()


@pytest.mark.parametrize("kind", KINDS)
def test_binary_sign_is_dppo_direction(pos: Positions, kind: str) -> None:
    g = predicted_change(
        pos.logits, pos.behavior, pos.tokens, pos.advantages, kind=kind, estimator="binary"
    )
    pi_a = torch.log_softmax(pos.logits.double(), -1).gather(-1, pos.tokens[:, None]).squeeze(-1)
    diff = pi_a.exp() - pos.behavior.token_logprobs.double().exp()
    clear = diff.abs() > 1e-5
    want = torch.sign(pos.advantages.double()) * torch.sign(diff)
    assert (torch.sign(g.double())[clear] == want[clear]).all()


@pytest.mark.parametrize("kind", KINDS)
def test_topk_with_full_vocabulary_equals_exact(kind: str) -> None:
    for vocab, seed in [(16, 0), (300, 1)]:
        p = positions(24, vocab, k=vocab, gap=0.7, seed=seed)
        for fn in (divergence, predicted_change):
            extra = () if fn is divergence else (p.advantages,)
            topk = fn(p.logits, p.behavior, p.tokens, *extra, kind=kind, estimator="topk")
            exact = fn(p.logits, p.behavior, p.tokens, *extra, kind=kind, estimator="exact")
            torch.testing.assert_close(topk, exact, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_topk_tail_equals_topk(pos: Positions, kind: str) -> None:
    """A constant mu/pi ratio on the tail leaves every f-divergence and its derivative equal to
    the lumped one: the two estimators are computed independently and must agree."""
    for fn in (divergence, predicted_change):
        extra = () if fn is divergence else (pos.advantages,)
        tail = fn(pos.logits, pos.behavior, pos.tokens, *extra, kind=kind, estimator="topk_tail")
        topk = fn(pos.logits, pos.behavior, pos.tokens, *extra, kind=kind, estimator="topk")
        torch.testing.assert_close(tail, topk, rtol=1e-3, atol=2e-6)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("kind", KINDS)
def test_divergence_equals_direct_computation(pos: Positions, kind: str, estimator: str) -> None:
    got = divergence(pos.logits, pos.behavior, pos.tokens, kind=kind, estimator=estimator)
    if estimator == "exact":
        want = exact_divergence_fn(pos.behavior, kind)(pos.logits.double())
    else:  # topk_tail equals the lumped divergence (see test_topk_tail_equals_topk)
        lumped = "binary" if estimator == "binary" else "topk"
        want = lumped_divergence_fn(pos.behavior, pos.tokens, kind, lumped)(pos.logits.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=2e-6)
    assert (got >= -1e-6).all()


def test_binary_tv_is_probability_gap() -> None:
    p = positions(200, 64, gap=1.0, seed=9)
    got = divergence(p.logits, p.behavior, p.tokens, kind="tv", estimator="binary")
    pi_a = torch.softmax(p.logits.double(), -1).gather(-1, p.tokens[:, None]).squeeze(-1)
    want = (pi_a - p.behavior.token_logprobs.double().exp()).abs()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=3e-7)


def test_sampled_token_missing_from_topk_and_duplicate_ids() -> None:
    """A view that breaks the engine convention still yields the proper lumped estimate."""
    p = positions(40, 200, k=10, gap=0.8, seed=3)
    logmu = p.behavior.full_logprobs
    assert logmu is not None
    top = logmu.topk(10, dim=-1)
    ids, lps = top.indices.clone(), top.values.clone()
    ids[:, -1], lps[:, -1] = ids[:, 0], lps[:, 0]  # a duplicate, sampled token maybe absent
    broken = BehaviorView(p.behavior.token_logprobs, ids, lps)
    clean_ids = torch.cat([top.indices[:, :9], p.tokens[:, None]], dim=-1)
    clean_lps = torch.cat([top.values[:, :9], p.behavior.token_logprobs[:, None]], dim=-1)
    clean = BehaviorView(p.behavior.token_logprobs, clean_ids, clean_lps)
    for kind in KINDS:
        for view_a, view_b in [(broken, clean)]:
            a = predicted_change(p.logits, view_a, p.tokens, p.advantages, kind=kind)
            b = predicted_change(p.logits, view_b, p.tokens, p.advantages, kind=kind)
            da = divergence(p.logits, view_a, p.tokens, kind=kind)
            db = divergence(p.logits, view_b, p.tokens, kind=kind)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(da, db, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_finite_for_tiny_probabilities_and_low_precision_logits(
    dtype: torch.dtype, estimator: str
) -> None:
    gen = torch.Generator().manual_seed(11)
    n, vocab = 32, 1000
    # logits spanning ~140 nats: pi down to ~1e-30 and below; mu with exact zeros (top-p).
    z = (torch.randn(n, vocab, generator=gen) * 20).clamp(-70, 70)
    zmu = z + torch.randn(n, vocab, generator=gen)
    zmu[:, 500:] = float("-inf")
    logmu = torch.log_softmax(zmu, dim=-1)
    tokens = torch.randint(0, 500, (n,), generator=gen)
    tokens[:8] = logmu[:8].argmin(dim=-1).clamp(max=499)  # very unlikely sampled tokens
    view = topk_view(logmu, tokens, 20)
    adv = torch.randn(n, generator=gen)
    logits = z.to(dtype)
    for kind in KINDS:
        d = divergence(logits, view, tokens, kind=kind, estimator=estimator)
        g = predicted_change(logits, view, tokens, adv, kind=kind, estimator=estimator)
        assert d.dtype == g.dtype == torch.float32
        assert torch.isfinite(d).all() and torch.isfinite(g).all(), (kind, estimator, dtype)
        # low-precision logits are computed exactly as their fp32 values would be
        d32 = divergence(logits.float(), view, tokens, kind=kind, estimator=estimator)
        torch.testing.assert_close(d, d32)


def test_softmax_stats_match_direct_reductions() -> None:
    p = positions(37, 3001, seed=2)
    stats = softmax_stats(p.logits.to(torch.bfloat16), entropy=True)
    z = p.logits.to(torch.bfloat16).double()
    logp = torch.log_softmax(z, -1)
    torch.testing.assert_close(stats.lse.double(), torch.logsumexp(z, -1), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(
        stats.sum_sq.double(), (logp.exp() ** 2).sum(-1), rtol=1e-5, atol=1e-8
    )
    assert stats.entropy is not None
    torch.testing.assert_close(
        stats.entropy.double(), -(logp.exp() * logp).sum(-1), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("chunk_elements", [4 * 50, 30], ids=["4-rows", "under-a-row"])
@pytest.mark.parametrize("given", ["nothing", "tokens", "tokens-and-view"])
def test_softmax_stats_over_many_chunks_equal_float64_sums(
    given: str, chunk_elements: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 4 rows over 11 (the last one shorter, so the reused scratch is sliced), or of
    one row where a row is longer than the chunk budget (a vocabulary over 2M entries), logits
    with -inf columns (a vocabulary padded or cut by top-p: their e * z is 0 * -inf) and every
    sum asked for, against float64 reductions. The logits require grad, as the loss's do: the
    pass must not record a graph, must not warn (an `out=` of the wrong size resizes with a
    warning instead of failing), and must make no tensor larger than one chunk."""
    monkeypatch.setattr("core.objective.estimators.CHUNK_ELEMENTS", chunk_elements)
    n, v = 11, 50
    p = positions(n, v, k=6, gap=0.5, seed=7)
    logits = p.logits.clone()
    logits[::3, 40:] = float("-inf")  # rows 0, 3, 6, 9: every chunk has some
    logits.requires_grad_()
    tokens = p.tokens if given != "nothing" else None
    view_ids = p.behavior.topk_ids if given == "tokens-and-view" else None
    with warnings.catch_warnings(), Allocations() as made:
        warnings.simplefilter("error")
        stats = softmax_stats(logits, entropy=True, tokens=tokens, view_ids=view_ids)
    # the point of the chunks: nothing larger than one chunk of rows is ever made
    assert made.largest == max(1, chunk_elements // v) * v

    z = logits.detach().double()
    pi = torch.softmax(z, -1)
    logp = torch.log_softmax(z, -1)

    def close(got: torch.Tensor | None, want: torch.Tensor) -> None:
        assert got is not None and not got.requires_grad
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7)

    close(stats.lse, torch.logsumexp(z, -1))
    close(stats.zmax, z.amax(-1))
    close(stats.sum_sq, (pi * pi).sum(-1))
    close(stats.entropy, -(pi * logp.clamp_min(-1e30)).sum(-1))
    if tokens is None:
        assert stats.rest_mass is None and stats.rest_sq is None
        return
    rest = pi.scatter(-1, tokens[:, None], 0.0)
    close(stats.rest_mass, rest.sum(-1))
    close(stats.rest_sq, (rest * rest).sum(-1))
    if view_ids is None:
        assert stats.tail_mass is None and stats.tail_sq is None
        return
    tail = rest.scatter(-1, view_ids, 0.0)
    close(stats.tail_mass, tail.sum(-1))
    close(stats.tail_sq, (tail * tail).sum(-1))


def test_softmax_stats_compute_the_entropy_only_when_asked() -> None:
    """The entropy costs a second (N, V) scratch buffer and a pass over it."""
    p = positions(8, 40, seed=1)
    assert softmax_stats(p.logits).entropy is None
    assert softmax_stats(p.logits, entropy=True).entropy is not None
    for estimator in ESTIMATORS:
        assert estimator_stats(p.logits, p.behavior, p.tokens, estimator).entropy is None
        stats = estimator_stats(p.logits, p.behavior, p.tokens, estimator, entropy=True)
        assert stats.entropy is not None


def test_softmax_stats_of_no_rows_are_empty() -> None:
    """A piece of a minibatch may hold no token: its statistics are empty, not an error."""
    stats = softmax_stats(torch.zeros(0, 7), entropy=True, tokens=torch.zeros(0, dtype=torch.long))
    assert stats.lse.shape == (0,) and stats.entropy is not None and stats.entropy.shape == (0,)
    assert stats.rest_mass is not None and stats.rest_mass.shape == (0,)


def test_gathered_logits_are_served_only_with_the_fused_pass_stats() -> None:
    """Gathered logits (the fused loss's columns) hold no full row: the divergence needs the
    stats of the pass that gathered them, and a lumped estimator; anything else is refused
    with a ValueError that says so, not a crash inside."""
    p = positions(6, 30, k=4, seed=2)
    ids = torch.cat([p.behavior.topk_ids, p.tokens[:, None]], dim=-1)
    cols = GatheredLogits(ids, p.logits.gather(-1, ids), 30)
    stats = softmax_stats(p.logits, tokens=p.tokens, view_ids=p.behavior.topk_ids)
    tv = {"kind": "tv", "estimator": "topk"}
    d, _ = divergence_and_change(cols, p.behavior, p.tokens, None, **tv, stats=stats)
    want, _ = divergence_and_change(p.logits, p.behavior, p.tokens, None, **tv)
    torch.testing.assert_close(d, want)
    for estimator, given in (("topk", None), ("binary", None), ("exact", stats)):
        with pytest.raises(ValueError, match="gathered logits serve"):
            divergence_and_change(
                cols, p.behavior, p.tokens, None, kind="tv", estimator=estimator, stats=given
            )


def test_bad_arguments_name_the_problem() -> None:
    p = positions(4, 30, seed=0, keep_full=False)
    with pytest.raises(ValueError, match="kind"):
        divergence(p.logits, p.behavior, p.tokens, kind="js", estimator="topk")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="full_logprobs"):
        divergence(p.logits, p.behavior, p.tokens, kind="tv", estimator="exact")
    with pytest.raises(ValueError, match="tokens"):
        divergence(p.logits, p.behavior, p.tokens[:2], kind="tv", estimator="topk")


def _near_one(shift: float) -> tuple[torch.Tensor, BehaviorView, torch.Tensor, torch.Tensor]:
    """64 positions of a 1000-token vocabulary where pi(a) = 0.9994 and mu(a) = 0.9989, A < 0,
    the rest of each distribution random; fp32 logits shifted by `shift` (a softmax ignores
    it, fp32 rounding does not: language models' logits are tens of units)."""
    gen = torch.Generator().manual_seed(2)
    n, vocab = 64, 1000
    rest = torch.randn(n, vocab - 1, generator=gen, dtype=torch.float64)
    moved = rest + 0.3 * torch.randn(n, vocab - 1, generator=gen, dtype=torch.float64)

    def dist(p_a: float, others: torch.Tensor) -> torch.Tensor:
        head = torch.full((n, 1), math.log(p_a), dtype=torch.float64)
        return torch.cat([head, math.log1p(-p_a) + torch.log_softmax(others, -1)], -1)

    logits = (dist(0.9994, rest) + shift).float()
    logmu = dist(0.9989, moved).float()
    tokens = torch.zeros(n, dtype=torch.long)
    return logits, topk_view(logmu, tokens, 5), tokens, -torch.ones(n)


def test_the_sampled_tokens_rate_cancels_in_fp32_near_pi_a_one() -> None:
    """The trap itself: the step factor 1 - pi_a - c = 1 - 2 pi_a + q, written that way in fp32
    from pi_a = exp(z_a - lse), is rounding noise at pi_a = 0.9994 (its true value is about
    3.6e-7), and with it the binary/top-K predicted change had the wrong sign. The float64
    value is (1 - pi_a)^2 + sum_{j != a} pi_j^2."""
    logits = _near_one(shift=60.0)[0]
    lse = torch.logsumexp(logits, -1)
    p_a = (logits[:, 0] - lse).exp()
    q = (torch.softmax(logits, -1) ** 2).sum(-1)
    cancelled = 1 - 2 * p_a + q
    pi = torch.softmax(logits.double(), -1)
    exact = (1 - pi[:, 0]) ** 2 + (pi[:, 1:] ** 2).sum(-1)
    assert (exact > 3e-7).all()
    assert ((cancelled.double() - exact).abs() > exact).float().mean() > 0.5


@pytest.mark.parametrize("shift", [10.0, 60.0])
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("kind", KINDS)
def test_change_near_pi_a_one_has_the_float64_sign(shift: float, kind: str, estimator: str) -> None:
    """pi(a) = 0.9994 > mu(a) = 0.9989 with A < 0: every estimator's predicted change against
    autograd of its own divergence in float64 (tests/core/references.py): the right sign on
    every row and within 1% (the cancelling form was wrong in sign on 20-100% of the rows for
    binary and top-K, and 5-15% off for the full-vocabulary estimators)."""
    logits, view, tokens, adv = _near_one(shift)
    got = predicted_change(logits, view, tokens, adv, kind=kind, estimator=estimator)
    if estimator == "exact":
        fn = exact_divergence_fn(view, kind)
    else:
        lumped = "binary" if estimator == "binary" else "topk"
        fn = lumped_divergence_fn(view, tokens, kind, lumped)
    want = autograd_change(fn, logits, tokens, adv)
    assert (torch.sign(got.double()) == torch.sign(want)).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=0.0)


@pytest.mark.parametrize("estimator", ["exact", "binary", "topk"])
@pytest.mark.parametrize("kind", KINDS)
def test_change_of_a_truncated_policy_matches_autograd(kind: str, estimator: str) -> None:
    """Top-p on both sides (`core.objective.truncation`): pi is 0 outside its nucleus plus the
    sampled token, mu outside the sampler's, and the nuclei differ. D's terms where pi is floored
    are constants: the predicted change is still autograd's of the (floored) divergence."""
    p = positions(48, 300, k=20, gap=1.0, peak=2.0, seed=13)
    assert p.behavior.full_logprobs is not None
    logmu = sampling_logprobs(p.behavior.full_logprobs, 1.0, 0.8)  # the sampler's mu
    gen = torch.Generator().manual_seed(14)
    tokens = torch.multinomial(logmu.exp(), 1, generator=gen)[:, 0]
    view = topk_view(logmu, tokens, 20)
    logits = truncate_to_nucleus(p.logits, tokens, 0.8)  # pi_p
    outside = torch.isinf(logits) & torch.isfinite(logmu)
    assert outside.any(dim=-1).float().mean() > 0.25  # mu samples where pi_p cannot
    got = predicted_change(logits, view, tokens, p.advantages, kind=kind, estimator=estimator)
    if estimator == "exact":
        fn = exact_divergence_fn(view, kind)
    else:
        fn = lumped_divergence_fn(view, tokens, kind, estimator)
    want = autograd_change(fn, logits, tokens, p.advantages)
    scale = _scale(Positions(logits, view, tokens, p.advantages))
    assert torch.isfinite(got).all()
    assert ((got.double() - want).abs() <= 1e-4 * want.abs() + 1e-5 * scale + 1e-12).all()


@pytest.mark.parametrize("estimator", ["binary", "topk"])
def test_stats_without_the_estimators_sums_are_completed(estimator: str) -> None:
    """`divergence_and_change` documents that stats lacking the sums an estimator needs (a
    caller's plain `softmax_stats`, or `binary`'s sums handed to `topk`) are completed by a pass
    of their own: D and g equal those computed from scratch."""
    p = positions(40, 300, k=8, gap=0.8, seed=9)
    args = (p.logits, p.behavior, p.tokens, p.advantages)
    want_d, want_g = divergence_and_change(*args, kind="kl", estimator=estimator)
    partial = [softmax_stats(p.logits, entropy=True)]
    if estimator == "topk":
        partial.append(softmax_stats(p.logits, tokens=p.tokens))  # rest sums, no tail
    for stats in partial:
        d, g = divergence_and_change(*args, kind="kl", estimator=estimator, stats=stats)
        assert torch.equal(d, want_d) and g is not None and want_g is not None
        assert torch.equal(g, want_g)


def test_kl_change_drops_only_the_terms_of_probabilities_below_the_floor() -> None:
    """KL(mu || pi)'s term -mu_i dlogp_i is dropped where pi_i is floored, that is strictly
    below 1e-30: a log-probability exactly at the floor is not floored (the clamp leaves it), so
    its term counts; one fp32 step below, it does not."""
    at = torch.tensor(LOG_FLOOR, dtype=torch.float32)
    below = torch.nextafter(at, at - 1)
    logm = torch.tensor([[-1.0, -0.5]])
    dlogp = torch.ones(1, 2)
    for logp_0, want in ((at, -(math.exp(-1.0) + math.exp(-0.5))), (below, -math.exp(-0.5))):
        logp = torch.stack([logp_0, torch.tensor(-0.1)])[None]
        _, g = _category_terms(logp, logm, dlogp, None, "kl")
        assert g is not None
        assert float(g) == pytest.approx(want, rel=1e-6)


def test_the_first_of_duplicate_view_ids_is_the_one_counted() -> None:
    """Of ids repeated in a view (and the sampled token, appended after it), the first in the
    row keeps weight 1 and the later ones 0: where duplicates disagree on log mu (an engine's
    top-K entry and its sampled-token log-prob, computed apart), the view's own entry counts,
    the same one on every run. Views of 30 ids, where torch's unstable sort reorders ties."""
    gen = torch.Generator().manual_seed(4)
    n, k = 50, 30
    ids = torch.randint(0, 8, (n, k), generator=gen)
    view = BehaviorView(torch.zeros(n), ids, torch.zeros(n, k))
    tokens = torch.randint(0, 8, (n,), generator=gen)
    got_ids, _, weight = _view_categories(view, tokens, "topk")
    want = torch.zeros(n, k + 1)
    for r, row in enumerate(got_ids.tolist()):
        for i, token in enumerate(row):
            want[r, i] = float(token not in row[:i])
    assert torch.equal(weight, want)


def test_entropy_of_large_logits_has_no_cancellation() -> None:
    """Logits shifted by 5000 (a softmax ignores it; ulp(5000) in fp32 is 5e-4): the entropy,
    taken from each row's maximum like the log-partition, stays within 1e-5 nats of float64
    (as lse - sum pi_i z_i it was off by up to 1e-3)."""
    gen = torch.Generator().manual_seed(8)
    logits = (torch.randn(16, 300, generator=gen, dtype=torch.float64) * 3 + 5000).float()
    z = logits.double()  # the fp32 logits' own values: the reference sees the same input
    want = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    stats = softmax_stats(logits, entropy=True)
    assert stats.entropy is not None
    assert float((stats.entropy.double() - want).abs().max()) < 1e-5


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_divergence_and_change_record_no_graph(estimator: str) -> None:
    """D and g decide a mask and fill statistics; with logits that require grad (the loss's)
    they must not hold the graph of their full-vocabulary passes."""
    p = positions(12, 50, k=5, seed=3)
    logits = p.logits.clone().requires_grad_()
    d, g = divergence_and_change(
        logits, p.behavior, p.tokens, p.advantages, kind="kl", estimator=estimator
    )
    assert g is not None
    assert not d.requires_grad and not g.requires_grad
