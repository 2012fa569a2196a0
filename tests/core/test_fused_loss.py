"""The fused loss (`core.objective.fused`) against the unfused one on the same logits: loss, mask,
every statistic and the gradients of the hidden states, the projection and its bias.

The unfused reference is `policy_loss` on `(hidden.float() @ weight.float().T + bias) / T`,
materialised and differentiated by autograd; it is tested against float64 formulas in
test_loss.py and test_divergence.py. Chunks are forced tiny (a few rows by 37 columns, the
vocabulary not a multiple of them) so that every sum crosses many chunks, the online maximum
moves, and the sampled token and the view's ids fall in every chunk position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import pytest
import torch
from torch import Tensor

import core.objective.fused as fused_module
from core import PolicyLossOutput, TrustRegion, fused_policy_loss, policy_loss
from core.objective.behavior import BehaviorView
from core.objective.estimators import KINDS, softmax_stats
from core.objective.fused import projected_stats, projected_token_logprobs
from core.objective.lazy_logits import GatheredLogits, ProjectedLogits
from core.objective.masks import MASKS
from core.objective.synthetic import topk_view
from tests.core.allocations import Allocations

N, H, V, K = 96, 32, 301, 8
PEAKED_ROWS = 24  # rows whose largest probability is 0.9999
PEAK = 0.9999


@pytest.fixture(autouse=True)
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_module, "VOCAB_CHUNK", 37)
    monkeypatch.setattr(fused_module, "CHUNK_ELEMENTS", 37 * 20)  # 20 rows by 37 columns


@dataclass(frozen=True)
class Case:
    hidden: Tensor  # (N, H)
    weight: Tensor  # (V, H)
    bias: Tensor | None
    temperature: float
    tokens: Tensor
    behavior: BehaviorView
    advantages: Tensor
    rmask: Tensor
    ref_logprobs: Tensor

    def logits(self) -> Tensor:
        return ProjectedLogits(self.hidden, self.weight, self.bias, self.temperature).materialize()


def _peak_scale(row: Tensor, bias: Tensor | None, temperature: float) -> float:
    """The factor s for which softmax((s * row + bias) / T) has largest probability PEAK
    (float64 bisection: that probability grows with s)."""
    lo, hi = 0.0, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        z = (mid * row + (0.0 if bias is None else bias)) / temperature
        if float(torch.softmax(z, -1).max()) < PEAK:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def make_case(
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    bias: bool = True,
    temperature: float = 0.7,
    gap: float = 0.5,
) -> Case:
    """Random hidden states and projection (logits of spread 3-4 nats) and, in the first
    PEAKED_ROWS rows, hidden states scaled until the top token has probability 0.9999; the
    behavior policy is the logits plus `gap` * noise, tokens drawn from it (in the peaked
    rows: the top token, with mu(a) lowered to about 0.96 at gap 0.5)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen, dtype=torch.float64)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64) * 0.5
    b = torch.randn(V, generator=gen, dtype=torch.float64) if bias else None
    for i in range(PEAKED_ROWS):
        hidden[i] *= _peak_scale(hidden[i] @ weight.T, b, temperature)
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    b = None if b is None else b.to(dtype)
    exact = ProjectedLogits(hidden, weight, b, temperature).materialize().double()
    noise = torch.randn(N, V, generator=gen, dtype=torch.float64)
    # mu peaked on the same token, less so (mu(a) 0.96 at gap 0.5): a divergence of 0.04
    top = exact[:PEAKED_ROWS].argmax(-1)
    noise[:PEAKED_ROWS] *= 0.05
    noise[torch.arange(PEAKED_ROWS), top] -= 12.0
    logmu = torch.log_softmax(exact + gap * noise, -1)
    tokens = torch.multinomial(logmu.exp(), 1, generator=gen).squeeze(-1)
    tokens[:PEAKED_ROWS] = top  # what mu samples 96% of the time
    logmu = logmu.float()
    ref = torch.log_softmax(exact + 0.3 * torch.randn(N, V, generator=gen), -1)
    return Case(
        hidden=hidden,
        weight=weight,
        bias=b,
        temperature=temperature,
        tokens=tokens,
        behavior=topk_view(logmu, tokens, K, keep_full=False),
        advantages=torch.randn(N, generator=gen),
        rmask=torch.rand(N, generator=gen) > 0.15,
        ref_logprobs=ref.gather(-1, tokens[:, None]).squeeze(-1).float(),
    )


def _leaves(case: Case, frozen: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    h = case.hidden.clone().requires_grad_()
    w = case.weight.clone().requires_grad_(not frozen)
    b = None if case.bias is None else case.bias.clone().requires_grad_()
    return h, w, b


def _grads(*leaves: Tensor | None) -> list[Tensor | None]:
    return [None if t is None or t.grad is None else t.grad.float() for t in leaves]


def _float64_grads(
    case: Case, frozen: bool, ref: PolicyLossOutput, args: dict[str, Any]
) -> list[Tensor | None]:
    """Gradients of the policy term, -sum_i w_i log pi(a_i) / |response|, with the weights
    w = A * min(ratio, cap) * keep of the unfused output, by float64 autograd (no KL term,
    the default normalizer)."""
    assert args["region"].kl_beta == 0.0 and "normalizer" not in args
    trained = (case.hidden, True), (case.weight, not frozen), (case.bias, True)
    leaves = [None if t is None else t.double().requires_grad_(g) for t, g in trained]
    h, w, b = leaves
    assert h is not None and w is not None
    rmask = args.get("response_mask", torch.ones(N, dtype=torch.bool))
    z = (h @ w.T + (0.0 if b is None else b)) / case.temperature
    logp_a = torch.log_softmax(z, -1).gather(-1, case.tokens[:, None]).squeeze(-1)
    weight = case.advantages.double() * ref.log_ratio.double().exp().clamp(max=1e4)
    weight = weight * ref.keep * rmask
    (-(weight * logp_a).sum() / rmask.sum()).backward()
    return [None if t is None or t.grad is None else t.grad.float() for t in leaves]


def compare(
    case: Case,
    frozen: bool = False,
    loss_abs: float = 0.0,
    exact_entropy: Tensor | None = None,
    float64_grads: bool = False,
    **loss_args: Any,
) -> dict[str, float]:
    """Runs both paths on `case`, asserts equal keep masks, loss and statistics to 1e-5
    relative and gradients to 1e-4 relative; returns the unfused statistics. `loss_abs`: an
    absolute tolerance on the loss, for losses made of log pi(a) near 0; `exact_entropy` (N,):
    the float64 entropies the fused entropy is held to instead; `float64_grads`: hold the
    fused gradients to float64 autograd of the same loss instead (see the callers)."""
    rmask = loss_args.get("response_mask")
    region = {f.name for f in fields(TrustRegion)}
    args: dict[str, Any] = {
        "tokens": case.tokens,
        "behavior": case.behavior,
        "advantages": case.advantages,
        "response_mask": case.rmask,
        "region": TrustRegion(
            delta_low=0.1, delta_high=0.1, **{k: v for k, v in loss_args.items() if k in region}
        ),
        **{k: v for k, v in loss_args.items() if k not in region},
    }
    h, w, b = _leaves(case, frozen)
    proj = ProjectedLogits(h, w, b, case.temperature)
    ref = policy_loss(logits=proj.materialize(), **args)
    ref.loss.backward()
    want = _grads(h, w, b)

    if float64_grads:
        want = _float64_grads(case, frozen, ref, args)
    h, w, b = _leaves(case, frozen)
    out = fused_policy_loss(ProjectedLogits(h, w, b, case.temperature), **args)
    out.loss.backward()
    got = _grads(h, w, b)

    assert torch.equal(out.keep, ref.keep)
    assert float(out.loss.detach()) == pytest.approx(
        float(ref.loss.detach()), rel=1e-5, abs=loss_abs
    )
    assert out.stats.keys() == ref.stats.keys()
    for name, value in ref.stats.items():
        if name == "entropy" and exact_entropy is not None:
            value = float(exact_entropy[case.rmask if rmask is None else rmask].mean())
        assert out.stats[name] == pytest.approx(value, rel=1e-5, abs=1e-9), name
    torch.testing.assert_close(out.log_ratio, ref.log_ratio, rtol=1e-5, atol=1e-5)
    for name, g_ref, g in zip(("hidden", "weight", "bias"), want, got, strict=True):
        if g_ref is None:
            assert g is None, f"{name} needs no gradient"
            continue
        assert g is not None, name
        rel = float((g - g_ref).norm() / g_ref.norm())
        assert rel < 1e-4, (name, rel)
        torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-4 * float(g_ref.abs().max()))
    return ref.stats


@pytest.mark.parametrize("estimator", ["binary", "topk"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mask", MASKS)
def test_fused_equals_unfused_for_every_mask_kind_and_estimator(
    mask: str, kind: str, estimator: str
) -> None:
    """Bias, temperature 0.7, the KL penalty to a reference and a per-token normalizer (the
    `seq_mean` aggregation) all on: every term of the loss goes through the fused path.

    The loss gets an absolute tolerance: advantages of both signs cancel to a loss of about
    0.0085 from terms whose absolute values add up to 14.5, so the summation order alone moves
    it by up to 1e-8 of that scale (1.7e-7 on an AVX-512 machine: 2e-5 of the total)."""
    case = make_case(seed=1)
    normalizer = 2.0 + torch.rand(N, generator=torch.Generator().manual_seed(2)) * 5
    stats = compare(
        case,
        loss_abs=1e-6,
        mask=mask,
        kind=kind,
        estimator=estimator,
        ref_logprobs=case.ref_logprobs,
        kl_beta=0.2,
        normalizer=normalizer,
    )
    if mask != "none":
        assert stats["masked_fraction"] > 0, "the setting must make the mask bite"
    assert stats["kl_ref"] > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen-projection"])
def test_fused_equals_unfused_across_dtypes_bias_and_a_frozen_projection(
    dtype: torch.dtype, bias: bool, frozen: bool
) -> None:
    """bf16 hidden states and projection are computed in fp32 like the reference's
    `.float()` logits; a frozen projection (LoRA) gets no gradient and costs none.

    The loss gets the absolute tolerance of the test above, for the same reason: its terms
    cancel to about 0.006, so one ulp of a row's log-partition (the unfused pass sums whole
    rows, the fused one chunks of 37 columns) moves it by 1e-5 of the total."""
    case = make_case(seed=3, dtype=dtype, bias=bias, temperature=1.0)
    for estimator in ("binary", "topk"):
        compare(case, frozen=frozen, loss_abs=1e-6, estimator=estimator, kind="kl")


def test_peaked_rows_keep_their_precision() -> None:
    """Rows with pi(a) = 0.9999 are where a total-minus-part sum would be rounding: the fused
    rest and tail sums, summed directly over chunks, give the unfused divergence and change
    there, off-policy; on-policy the divergence stays at rounding (< 1e-6) in both.

    The loss of such rows is made of log pi(a) = -1e-4, which both paths know only to fp32's
    resolution of the partition function (1.2e-7 absolute: 1e-3 relative), so it is compared
    to that absolute tolerance per unit of the mean |weight|; its gradient, 1e-4 relative.
    Their entropy (1e-3 nats) and gradients are held to float64 rather than to the unfused
    path, which is less exact there: it writes the entropy as zmax + log Z - sum pi z, which
    at these rows' logits (magnitude ~300) loses 4e-5 to the rounding of zmax, where the fused
    pass sums pi (z - zmax) directly; and cross-entropy's gradient takes 1 - pi_a as written
    (5e-4 relative error in the hidden states' gradient here), where the fused backward uses
    the sum over the other tokens."""
    peaked = torch.zeros(N, dtype=torch.bool)
    peaked[:PEAKED_ROWS] = True
    for gap in (0.5, 0.0):
        case = make_case(seed=4, gap=gap)
        pi = torch.softmax(case.logits().double(), -1)
        p_a = pi.gather(-1, case.tokens[:, None]).squeeze(-1)
        assert (p_a[:PEAKED_ROWS] - PEAK).abs().max() < 5e-4  # the setting holds what it says
        resolution = 2.4e-7 * float(case.advantages[peaked].abs().mean())  # two ulps of 1.0
        logp = torch.log_softmax(case.logits().double(), -1)
        entropy = -(logp.exp() * logp).sum(-1)
        for kind in KINDS:
            if gap > 0:
                stats = compare(
                    case,
                    kind=kind,
                    estimator="topk",
                    response_mask=peaked,
                    loss_abs=resolution,
                    exact_entropy=entropy,
                    float64_grads=True,
                )
                assert stats["divergence_max"] > 1e-5, (kind, stats)  # a divergence to compare
                continue
            h, w, b = _leaves(case, frozen=False)
            args = {"tokens": case.tokens, "behavior": case.behavior}
            out = fused_policy_loss(
                ProjectedLogits(h, w, b, case.temperature),
                **args,
                advantages=case.advantages,
                region=TrustRegion(kind=kind),  # type: ignore[arg-type]
                response_mask=peaked,
            )
            assert out.stats["divergence_max"] < 1e-6, (kind, out.stats)


def test_policy_loss_of_projected_logits_is_the_fused_path() -> None:
    """`policy_loss` given `ProjectedLogits` (what the trainer passes) returns exactly what
    `fused_policy_loss` does."""
    case = make_case(seed=5)
    args = {"tokens": case.tokens, "behavior": case.behavior, "advantages": case.advantages}
    proj = ProjectedLogits(case.hidden, case.weight, case.bias, case.temperature)
    via = policy_loss(logits=proj, **args)  # type: ignore[arg-type]
    direct = fused_policy_loss(
        ProjectedLogits(case.hidden, case.weight, case.bias, case.temperature), **args
    )
    assert torch.equal(via.loss, direct.loss) and via.stats == direct.stats


@pytest.mark.parametrize("estimator", ["exact", "topk_tail"])
def test_full_vocabulary_estimators_are_refused(estimator: str) -> None:
    case = make_case(seed=6)
    with pytest.raises(ValueError, match=f"not '{estimator}'.*unfused path"):
        fused_policy_loss(
            ProjectedLogits(case.hidden, case.weight, case.bias),
            case.tokens,
            case.behavior,
            case.advantages,
            TrustRegion(estimator=estimator),  # type: ignore[arg-type]
        )


def test_token_logprobs_are_cross_entropy_with_its_gradient() -> None:
    """The warm-up's loss and the reference's log-probs: -cross_entropy of the logits, value
    and gradient, with no statistics pass beyond the log-partition function."""
    case = make_case(seed=7, dtype=torch.float32)
    h, w, b = _leaves(case, frozen=False)
    proj = ProjectedLogits(h, w, b, case.temperature)
    want = -torch.nn.functional.cross_entropy(proj.materialize(), case.tokens, reduction="none")
    want.mean().backward()
    grads = _grads(h, w, b)
    h, w, b = _leaves(case, frozen=False)
    got = projected_token_logprobs(ProjectedLogits(h, w, b, case.temperature), case.tokens)
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
    got.mean().backward()
    for g_ref, g in zip(grads, _grads(h, w, b), strict=True):
        assert g_ref is not None and g is not None
        assert float((g - g_ref).norm() / g_ref.norm()) < 1e-4


def test_projected_logits_name_the_shape_that_does_not_fit() -> None:
    h, w = torch.zeros(3, 4), torch.zeros(10, 4)
    with pytest.raises(ValueError, match=r"bias must be \(V=10,\), got \(4,\)"):
        ProjectedLogits(h, w, torch.zeros(4))
    with pytest.raises(ValueError, match=r"share their last dimension H"):
        ProjectedLogits(h, torch.zeros(10, 5))
    with pytest.raises(ValueError, match=r"temperature must be > 0, got 0"):
        ProjectedLogits(h, w, None, 0.0)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_materialized_logits_are_the_projection_over_the_temperature(temperature: float) -> None:
    gen = torch.Generator().manual_seed(3)
    h, w, b = torch.randn(5, 4, generator=gen), torch.randn(7, 4, generator=gen), torch.randn(7)
    want = (h @ w.T + b) / temperature
    got = ProjectedLogits(h, w, b, temperature).materialize()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_gathered_logits_answer_only_their_columns() -> None:
    cols = GatheredLogits(torch.tensor([[4, 1], [2, 2]]), torch.tensor([[0.5, 1.5], [3.0, 3.0]]), 9)
    assert cols.shape == (2, 9)
    assert torch.equal(cols.at(torch.tensor([[1], [2]])), torch.tensor([[1.5], [3.0]]))
    with pytest.raises(KeyError):
        cols.at(torch.tensor([[1], [4]]))


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_projected_stats_are_softmax_stats_of_the_projection_within_one_chunk(
    temperature: float,
) -> None:
    """With its defaults (`sums` on, no entropy) `projected_stats` is `softmax_stats` of the
    materialized logits, at temperature 1 and 2 (the division is skipped at 1 only); its two
    scratch buffers hold one chunk of rows by the chunk's columns plus the spare, never all
    the rows (20 rows of the 96 by 38 columns, with the tiny chunks of this file)."""
    case = make_case(seed=5, temperature=temperature)
    proj = ProjectedLogits(case.hidden, case.weight, case.bias, temperature)
    with Allocations() as made:
        stats, _ = projected_stats(proj, case.tokens, case.behavior.topk_ids)
    assert sorted(made.empties)[-2:] == [20 * 38, 20 * 38]
    want = softmax_stats(proj.materialize(), tokens=case.tokens, view_ids=case.behavior.topk_ids)
    assert stats.entropy is None
    for name in ("lse", "sum_sq", "rest_mass", "rest_sq", "tail_mass", "tail_sq"):
        got, ref = getattr(stats, name), getattr(want, name)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-7, msg=name)


def test_projected_stats_with_minus_inf_logits_and_a_running_top_k() -> None:
    """A bias of -inf on the first column chunk (every row's running maximum is -inf through it)
    and on scattered columns (the entropy's e * z is 0 * -inf there): every statistic and the
    K-th largest logit equal the unfused pass over the materialized logits."""
    case = make_case(seed=6, temperature=1.0)
    assert case.bias is not None
    bias = case.bias.clone()
    bias[:37] = float("-inf")  # the whole first chunk (VOCAB_CHUNK is 37 here)
    bias[100:301:7] = float("-inf")
    keep = torch.isfinite(bias)
    tokens = torch.where(keep[case.tokens], case.tokens, 40)  # sampled where pi > 0
    proj = ProjectedLogits(case.hidden, case.weight, bias, 1.0)
    ids = case.behavior.topk_ids
    stats, _ = projected_stats(proj, tokens, ids, entropy=True, top_k=5)
    logits = proj.materialize()
    want = softmax_stats(logits, entropy=True, tokens=tokens, view_ids=ids)
    for name in (
        "zmax",
        "lse",
        "sum_sq",
        "entropy",
        "rest_mass",
        "rest_sq",
        "tail_mass",
        "tail_sq",
    ):
        got, ref = getattr(stats, name), getattr(want, name)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6, msg=name)
    assert stats.kth_logit is not None
    torch.testing.assert_close(stats.kth_logit, logits.topk(5, dim=-1).values[:, -1])


def test_fused_defaults_are_the_unfused_ones() -> None:
    """`fused_policy_loss` without a temperature or a cap is temperature 1 and the documented
    cap 1e4: one token with logits [1, 0] (pi(a) = sigmoid(1)) 20000 times likelier under pi
    than under mu, A = 1, mask `none`: loss = -1e4 log sigmoid(1). `ProjectedLogits` without a
    temperature is the plain projection."""
    hidden, weight = torch.tensor([[1.0]]), torch.tensor([[1.0], [0.0]])
    tokens = torch.tensor([0])
    log_pi_a = -math.log1p(math.exp(-1.0))
    logmu = torch.tensor([[log_pi_a - math.log(20000.0), 0.0]])
    logmu[0, 1] = math.log1p(-math.exp(float(logmu[0, 0])))
    view = topk_view(logmu, tokens, 2)
    none = TrustRegion(mask="none")
    out = fused_policy_loss(
        ProjectedLogits(hidden, weight), tokens, view, torch.tensor([1.0]), none
    )
    assert float(out.loss) == pytest.approx(-1e4 * log_pi_a, rel=1e-6)
    assert torch.equal(ProjectedLogits(hidden, weight).materialize(), torch.tensor([[1.0, 0.0]]))


def test_fused_loss_names_rows_that_do_not_match() -> None:
    case = make_case(seed=2)
    with pytest.raises(ValueError, match=rf"hidden has {N - 1} rows, tokens {N}"):
        fused_policy_loss(
            ProjectedLogits(case.hidden[:-1], case.weight, case.bias),
            case.tokens,
            case.behavior,
            case.advantages,
        )
    with pytest.raises(ValueError, match=r"hidden must be \(N, H\)"):
        ProjectedLogits(case.hidden[None], case.weight)


def test_the_backward_pass_holds_one_chunk_of_logits() -> None:
    """The gradient of log pi(a) recomputes the logits chunk by chunk into one buffer of 20 rows
    by 38 columns (the tiny chunks here), never all 96 rows."""
    case = make_case(seed=7)
    h, w, b = _leaves(case, frozen=False)
    logp = projected_token_logprobs(ProjectedLogits(h, w, b, case.temperature), case.tokens)
    with Allocations() as made:
        logp.sum().backward()
    assert max(made.empties) == 20 * 38
