"""The fast statistics pass (`softmax_stats` over ATen's fused softmax kernel) against a
straightforward float64 implementation, and the mask built on it against float64 references.

The pass takes each row from the kernel only up to a factor and divides by its own sums
(`chunk_sums`): the kernel's running sum is up to 1e-5 off at 152k entries, and ties, -inf
columns and a view that lists an id twice are where a shortcut would show.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from core import TrustRegion, trust_region
from core.objective.behavior import BehaviorView
from core.objective.estimators import Kind, SoftmaxStats, divergence_and_change, softmax_stats
from core.objective.row_sums import chunk_sums
from tests.core.references import autograd_change, exact_divergence_fn, lumped_divergence_fn

# (rows, vocabulary): one column, a handful, a chunk of many rows, Llama's and Qwen 2's widths
SHAPES = [(3, 1), (6, 7), (40, 301), (4, 32000), (3, 152064)]


def _case(n: int, v: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """Logits (spread 3 nats, one peaked row) with ties and -inf columns, sampled tokens, and
    view ids that hold the token in some rows and list an id twice in others."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, generator=gen) * 3.0
    z[0] = 1.5  # every column tied
    if n > 1 and v > 1:
        z[1, : max(1, v // 3)] = z[1].max()  # a third of the row tied at its maximum
    if n > 2 and v > 2:
        z[2, 1::2] = float("-inf")  # every other column cut (top-p, padding)
    if n > 3:
        z[3] *= 8.0  # peaked: the top token near probability 1
    tokens = torch.randint(0, v, (n,), generator=gen)
    if n > 2 and v > 2:
        tokens[2] = 0  # the -inf row samples a finite column
    k = min(5, v)
    ids = torch.stack([torch.randperm(v, generator=gen)[:k] for _ in range(n)])
    ids[::2, 0] = tokens[::2]  # the token in the view
    if k > 2:
        ids[1::2, 2] = ids[1::2, 1]  # an id listed twice
    return z, tokens, ids


def _view(logmu: Tensor, tokens: Tensor, ids: Tensor, full: bool = False) -> BehaviorView:
    """What a rollout engine reports of `logmu` (float64, the behaviour policy's log-probabilities):
    the sampled token's, the top-K ids' (`ids`), and with `full` the whole row (vLLM's
    full-vocabulary logprobs, which the exact estimator reads)."""
    return BehaviorView(
        logmu.gather(-1, tokens[:, None]).squeeze(-1).float(),
        ids,
        logmu.gather(-1, ids).float(),
        full_logprobs=logmu.float() if full else None,
    )


def _reference(z: Tensor, tokens: Tensor, ids: Tensor) -> dict[str, Tensor]:
    """Every statistic by its definition, in float64, over whole rows."""
    z64 = z.double()
    logp = torch.log_softmax(z64, -1)
    p = logp.exp()
    rest = p.scatter(-1, tokens[:, None], 0.0)
    tail = rest.scatter(-1, ids, 0.0)
    finite = torch.isfinite(z64)
    return {
        "lse": torch.logsumexp(z64, -1),
        "zmax": z64.amax(-1),
        "sum_sq": (p * p).sum(-1),
        "entropy": -(torch.where(finite, p * logp, 0.0)).sum(-1),
        "rest_mass": rest.sum(-1),
        "rest_sq": (rest * rest).sum(-1),
        "tail_mass": tail.sum(-1),
        "tail_sq": (tail * tail).sum(-1),
    }


@pytest.mark.parametrize(("n", "v"), SHAPES, ids=[f"{n}x{v}" for n, v in SHAPES])
def test_softmax_stats_equal_a_float64_reference(n: int, v: int) -> None:
    z, tokens, ids = _case(n, v, seed=n + v)
    got: SoftmaxStats = softmax_stats(z, entropy=True, tokens=tokens, view_ids=ids)
    want = _reference(z, tokens, ids)
    for name, ref in want.items():
        value = getattr(got, name)
        assert value is not None and value.dtype == torch.float32, name
        # relative 1e-5; the absolute floor is far below the smallest sums compared here
        # (a tail of 1e-12 at 152k columns would still be held to 1e-5 of itself + 1e-14)
        torch.testing.assert_close(value.double(), ref, rtol=1e-5, atol=1e-14, msg=name)
    # the tied row's statistics are known in closed form: pi = 1/V everywhere
    torch.testing.assert_close(got.log_norm[0].double(), torch.tensor(v).double().log())
    torch.testing.assert_close(got.sum_sq[0].double(), torch.tensor(1.0 / v).double())


@pytest.mark.parametrize(("n", "v"), SHAPES[1:4], ids=[f"{n}x{v}" for n, v in SHAPES[1:4]])
@pytest.mark.parametrize("kind", ["tv", "kl", "kl_reverse"])
def test_topk_divergence_change_and_mask_equal_float64_references(
    n: int, v: int, kind: Kind
) -> None:
    """D and its predicted change from the fast stats against the float64 lumped divergence and
    its autograd derivative; the mask decided from the reference values where they are clear
    of the threshold and of zero (1e-5) is the mask computed."""
    z, tokens, ids = _case(n, v, seed=2 * n + v)
    z = torch.where(torch.isfinite(z), z, torch.full_like(z, -1e4))  # autograd of the reference
    gen = torch.Generator().manual_seed(v)
    logmu = torch.log_softmax(
        z.double() + torch.randn(n, v, generator=gen, dtype=torch.float64), -1
    )
    view = _view(logmu, tokens, ids)
    adv = torch.randn(n, generator=gen)
    d, g = divergence_and_change(z, view, tokens, adv, kind=kind, estimator="topk")
    assert g is not None
    fn = lumped_divergence_fn(view, tokens, kind, "topk")
    d_ref = fn(z.double())
    g_ref = autograd_change(fn, z, tokens, adv)
    torch.testing.assert_close(d.double(), d_ref, rtol=1e-5, atol=1e-6)
    # g's scale is |A| (its rates are A times probabilities): an absolute 1e-6 of it
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-6 * float(adv.abs().max()))

    delta = float(d_ref.median())  # half the rows past it: both answers of the proximity test
    spec = TrustRegion(
        mask="predictive", kind=kind, estimator="topk", delta_low=delta, delta_high=delta
    )
    region = trust_region(z, view, tokens, adv, spec)
    clear = ((d_ref - delta).abs() > 1e-5) & (g_ref.abs() > 1e-5)
    masked = (d_ref > delta) & (g_ref > 0) & (adv != 0)
    assert torch.equal(region.keep[clear], ~masked[clear])


@pytest.mark.parametrize(("n", "v"), SHAPES, ids=[f"{n}x{v}" for n, v in SHAPES])
@pytest.mark.parametrize("kind", ["tv", "kl", "kl_reverse"])
@pytest.mark.parametrize("estimator", ["exact", "topk_tail"])
def test_full_vocabulary_estimators_equal_float64_references(
    n: int, v: int, kind: Kind, estimator: str
) -> None:
    """The scratch-buffer pass of `exact` and `topk_tail` (`core.objective.full_vocab`) against
    the float64 divergence by definition and its autograd derivative, on rows with ties, -inf
    columns (in pi, and in mu: a top-p behavior policy), a peaked row and a view listing an id
    twice; `topk_tail` against the lumped divergence, which it equals (module docstring)."""
    z, tokens, ids = _case(n, v, seed=3 * n + v)
    z = torch.where(torch.isfinite(z), z, torch.full_like(z, -1e4))  # autograd of the reference
    gen = torch.Generator().manual_seed(v + 1)
    logmu = torch.log_softmax(
        z.double() + torch.randn(n, v, generator=gen, dtype=torch.float64), -1
    )
    if n > 1 and v > 2:
        logmu[1, 1::3] = float("-inf")  # mu cut outside its nucleus (the rest left unnormalised)
    view = _view(logmu, tokens, ids, full=estimator == "exact")
    adv = torch.randn(n, generator=gen)
    d, g = divergence_and_change(z, view, tokens, adv, kind=kind, estimator=estimator)
    assert g is not None and d.dtype == torch.float32 and g.dtype == torch.float32
    if estimator == "exact":
        fn = exact_divergence_fn(view, kind)
    else:
        fn = lumped_divergence_fn(view, tokens, kind, "topk")
    d_ref = fn(z.double())
    g_ref = autograd_change(fn, z, tokens, adv)
    torch.testing.assert_close(d.double(), d_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-6 * float(adv.abs().max()))
    # D without a step is the same pass's D
    d_only, none = divergence_and_change(z, view, tokens, None, kind=kind, estimator=estimator)
    assert none is None
    torch.testing.assert_close(d_only, d, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["tv", "kl", "kl_reverse"])
def test_the_change_of_a_token_near_probability_1_is_accurate_to_itself(kind: Kind) -> None:
    """Rows whose sampled token leads the others by 8, 12 and 16 nats (1 - pi_a from 2e-2 to
    6e-6): their change is a small difference of terms near 1, which the sampled token's rate
    takes without cancellation (`full_vocab._rates`' near-one forms). Relative to itself, not to
    the batch's largest: taken as `pi_a - (sum pi^2)` in fp32, the 12-nat row's KL change is 35
    times too large and the 16-nat row's has the wrong sign, both far inside the other test's
    absolute tolerance."""
    n, v = 3, 50
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(n, v, generator=gen)
    tokens = torch.arange(n)
    for row, gap in enumerate([8.0, 12.0, 16.0]):
        z[row, row] = z[row].max() + gap
    noise = 0.5 * torch.randn(n, v, generator=gen, dtype=torch.float64)
    logmu = torch.log_softmax(z.double() + noise, -1)
    ids = torch.arange(5).expand(n, 5)
    view = _view(logmu, tokens, ids, full=True)
    adv = torch.ones(n)
    _, g = divergence_and_change(z, view, tokens, adv, kind=kind, estimator="exact")
    g_ref = autograd_change(exact_divergence_fn(view, kind), z, tokens, adv)
    assert g is not None
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-4, atol=0.0)


def test_kl_drops_the_change_where_pi_is_floored_and_mu_is_not() -> None:
    """KL(mu || pi)'s term -m dlogp is dropped where pi is floored at 1e-30 (the float64
    reference clamps there too, so its derivative is 0): here column 4 has pi = e^-100 and
    mu = 0.2. Counted instead (a mask that keeps the floored entries), the change of both rows
    is off by 6 to 38% (-0.189 for -0.137)."""
    n, v = 2, 9
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(n, v, generator=gen)
    z[:, 4] = -100.0
    tokens = torch.tensor([0, 1])
    mu = torch.softmax(torch.randn(n, v, generator=gen, dtype=torch.float64), -1)
    mu[:, 4] = 0.0
    mu = 0.8 * mu / mu.sum(-1, keepdim=True)
    mu[:, 4] = 0.2
    logmu = mu.log()
    ids = torch.arange(5).expand(n, 5)
    view = _view(logmu, tokens, ids, full=True)
    adv = torch.tensor([1.0, -1.0])
    _, g = divergence_and_change(z, view, tokens, adv, kind="kl", estimator="exact")
    g_ref = autograd_change(exact_divergence_fn(view, "kl"), z, tokens, adv)
    assert g is not None
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-7)


def test_chunk_sums_of_a_row_with_no_finite_logit_are_zero() -> None:
    """The kernel's row of a row that is all -inf is NaN (0 / 0); its sums are 0 and its
    maximum 0, as documented, so that no NaN reaches the other rows' arithmetic."""
    z = torch.randn(3, 9)
    z[1] = float("-inf")
    tokens = torch.tensor([[2], [4], [0]])
    ids = torch.tensor([[1, 3], [5, 6], [7, 8]])
    sums = chunk_sums(z, torch.empty(3, 9), tokens, ids, torch.empty(3, 9))
    for name in ("zmax", "total", "sum_sq", "ez", "rest", "rest_sq", "tail", "tail_sq"):
        value = getattr(sums, name)
        assert value is not None and float(value[1]) == 0.0, name
        assert torch.isfinite(value).all() and (value[[0, 2]] != 0).all(), name


@pytest.mark.parametrize("estimator", ["exact", "topk_tail"])
def test_full_vocabulary_estimators_of_no_rows_are_empty(estimator: str) -> None:
    """A batch with no generated tokens (every row masked out upstream) has nothing to chunk:
    the pass returns empty rows rather than failing on a zero-row chunk size."""
    view = BehaviorView(
        torch.zeros(0),
        torch.zeros(0, 3, dtype=torch.long),
        torch.zeros(0, 3),
        full_logprobs=torch.zeros(0, 11) if estimator == "exact" else None,
    )
    d, g = divergence_and_change(
        torch.zeros(0, 11),
        view,
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0),
        kind="tv",
        estimator=estimator,
    )
    assert g is not None and d.shape == (0,) and g.shape == (0,)
