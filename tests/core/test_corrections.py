"""The off-policy corrections (`core.objective.corrections`) against float64 references written
here from each published definition, one token or one sequence at a time in plain Python:
the weights, then the loss and its gradient through both loss paths (logits, and the fused
hidden states and projection), for every correction under every trust-region mask.

The case has ties (duplicated rows of the projection: equal logits in every row), -inf entries
in the behavior's top-K view (rows whose mu has fewer than K tokens, as under top-p), tokens with
A = 0, response masks with holes, sequences of 1 to 37 tokens, and corrections that drop every
token (loss 0, gradient 0, nothing NaN).

`python -m tests.core.test_corrections` prints the table of the largest differences, per
correction, over every mask and both paths (bench/results/corrections-reference-*.txt).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torch import Tensor

import core.objective.fused as fused_module
from core import TrustRegion, policy_loss
from core.config import AlgorithmConfig
from core.objective.behavior import BehaviorView
from core.objective.corrections import Correction, correction_weights
from core.objective.lazy_logits import ProjectedLogits
from core.objective.masks import MASKS
from core.objective.synthetic import topk_view

N, H, V, K = 240, 24, 97, 12
TRUNCATED_ROWS = 30  # rows whose mu has 8 < K tokens: the view's last entries are -inf

OPTIONS: dict[str, dict[str, Any]] = {
    "none": {"type": "none"},
    "none_is_cap": {"type": "none", "is_cap": 1.3},
    "tis_token": {"type": "tis", "level": "token", "cap": 1.3},
    "tis_sequence": {"type": "tis", "level": "sequence", "cap": 2.0},
    "mis_token": {"type": "mis", "level": "token", "cap": 1.3},
    "mis_sequence": {"type": "mis", "level": "sequence", "cap": 2.0},
    "icepop": {"type": "icepop", "low": 0.8, "high": 1.25},
    "geo_rs": {"type": "geo_rs", "low": 0.97, "high": 1.03},
    "geo_rs_is_cap": {"type": "geo_rs", "low": 0.97, "high": 1.03, "is_cap": 1.3},
    "cispo": {"type": "cispo", "eps_low": 0.2, "eps_high": 0.28},
}
"""Each correction as a spec writes it (is_cap beside it where it combines with one), with
parameters that bite on the case below (tested: each drops or clips some tokens)."""

DROPS_ALL: dict[str, dict[str, Any]] = {
    "icepop_band_1": {"type": "icepop", "low": 1.0, "high": 1.0},
    "geo_rs_band_1": {"type": "geo_rs", "low": 1.0, "high": 1.0},
    "mis_token_cap_1": {"type": "mis", "level": "token", "cap": 1.0},
}
"""Corrections that drop every token of the off-policy case (all of mis's: r > 1 is forced)."""


def region_of(option: dict[str, Any], mask: str) -> TrustRegion:
    """The trust region the trainer builds from a spec with this correction and mask."""
    spec = {k: v for k, v in option.items() if k != "is_cap"}
    algorithm = {"mask": mask, "delta_low": 0.1, "delta_high": 0.1, "correction": spec}
    if "is_cap" in option:
        algorithm["is_cap"] = option["is_cap"]
    return TrustRegion.from_config(AlgorithmConfig.model_validate(algorithm))


@dataclass(frozen=True)
class Case:
    hidden: Tensor  # (N, H) fp32
    weight: Tensor  # (V, H): rows 1 and 2 copy row 0 (tied logits everywhere)
    tokens: Tensor  # (N,)
    behavior: BehaviorView
    advantages: Tensor  # (N,), some exactly 0
    rmask: Tensor  # (N,) bool, with holes
    sequence_ids: Tensor  # (N,) sorted, lengths 1..37

    def logits(self) -> Tensor:
        return ProjectedLogits(self.hidden, self.weight).materialize()


def make_case(seed: int = 0, *, gap: float = 0.3, above_one: bool = False) -> Case:
    """`above_one`: mu(a) below pi(a) for every token (r > 1), for the drop-everything case."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) * 0.6
    weight[1:3] = weight[0]
    z = hidden @ weight.T
    noisy = z + gap * torch.randn(N, V, generator=gen)
    noisy[:TRUNCATED_ROWS, 8:] = float("-inf")  # only 8 tokens may be sampled in these rows
    logmu = torch.log_softmax(noisy, -1)
    tokens = torch.multinomial(logmu.exp(), 1, generator=gen).squeeze(-1)
    if above_one:
        logpi = torch.log_softmax(z, -1).gather(-1, tokens[:, None]).squeeze(-1)
        logmu.scatter_(-1, tokens[:, None], (logpi - 0.05)[:, None])
    behavior = topk_view(logmu, tokens, K, keep_full=False)
    assert torch.isinf(behavior.topk_logprobs[:TRUNCATED_ROWS]).any()
    advantages = torch.randn(N, generator=gen)
    advantages[::11] = 0.0
    rmask = torch.rand(N, generator=gen) > 0.15
    lengths, total = [], 0
    while total < N:
        lengths.append(min(int(torch.randint(1, 38, (1,), generator=gen)), N - total))
        total += lengths[-1]
    sequence_ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return Case(
        hidden=hidden,
        weight=weight,
        tokens=tokens,
        behavior=behavior,
        advantages=advantages,
        rmask=rmask,
        sequence_ids=sequence_ids,
    )


def reference_weights(
    log_ratio: list[float],
    sequence_ids: list[int],
    rmask: list[bool],
    correction: Correction,
    is_cap: float,
) -> tuple[list[float], list[bool], list[bool]]:
    """(weight, dropped, clipped) per token in float64, from the definitions (the sources are in
    `core.objective.corrections`'s docstring): r_t = exp(log_ratio_t), sequences over the
    response tokens only; weights 0 outside the response and on dropped tokens."""
    n = len(log_ratio)
    r = [math.exp(x) for x in log_ratio]
    members: dict[int, list[int]] = {}
    for t in range(n):
        if rmask[t]:
            members.setdefault(sequence_ids[t], []).append(t)
    seq_sum = {s: sum(log_ratio[t] for t in ts) for s, ts in members.items()}
    weight, dropped, clipped = [0.0] * n, [False] * n, [False] * n
    kind, cap, low, high = correction.type, correction.cap, correction.low, correction.high
    for t in range(n):
        if not rmask[t]:
            continue
        s = sequence_ids[t]
        if correction.level == "sequence":
            prod = math.exp(seq_sum[s]) if seq_sum[s] < 700 else math.inf
        if kind == "none":  # pdppo's (and DPPO's) sg(min(pi/mu, c))
            w, drop, clip = min(r[t], is_cap), False, r[t] > is_cap
        elif kind == "tis" and correction.level == "token":  # min(rho_t, C)
            w, drop, clip = min(r[t], cap), False, r[t] > cap
        elif kind == "tis":  # min(prod_t rho_t, C) on every token of the sequence
            w, drop, clip = min(prod, cap), False, prod > cap
        elif kind == "mis" and correction.level == "token":  # rho_t * 1[rho_t <= C]
            w, drop, clip = r[t], r[t] > cap, False
        elif kind == "mis":  # rho(y) * 1[rho(y) <= C]
            w, drop, clip = prod, prod > cap, False
        elif kind == "icepop":  # M(k) = k on [alpha, beta], else 0
            w, drop, clip = r[t], not low <= r[t] <= high, False
        elif kind == "geo_rs":  # accept iff low <= (prod rho)^(1/|T|) <= high; rejection only
            geo = math.exp(seq_sum[s] / len(members[s]))
            w, drop, clip = min(r[t], is_cap), not low <= geo <= high, r[t] > is_cap
        else:  # cispo: clip(r, 1 - eps_low, 1 + eps_high), never dropped
            w, drop, clip = min(max(r[t], low), high), False, not low <= r[t] <= high
        weight[t] = 0.0 if drop else w
        dropped[t], clipped[t] = drop, clip and not drop
    return weight, dropped, clipped


@dataclass(frozen=True)
class Difference:
    loss: float
    grad: float
    correction_masked: float  # the share of response tokens the correction dropped
    correction_clipped: float


def compare(case: Case, region: TrustRegion, *, fused: bool) -> Difference:
    """Runs the loss on `case` under `region` (fused or from logits) and returns its largest
    differences from the float64 reference: loss, and the gradient of the logits (unfused) or
    of the hidden states and the projection (fused)."""
    hidden = case.hidden.clone().requires_grad_()
    weight = case.weight.clone().requires_grad_()
    proj = ProjectedLogits(hidden, weight)
    logits = proj if fused else proj.materialize()
    args = {
        "tokens": case.tokens,
        "behavior": case.behavior,
        "advantages": case.advantages,
        "region": region,
        "response_mask": case.rmask,
        "sequence_ids": case.sequence_ids,
    }
    out = policy_loss(logits, **args)  # type: ignore[arg-type]
    out.loss.backward()
    assert hidden.grad is not None and weight.grad is not None
    assert torch.isfinite(out.loss) and torch.isfinite(hidden.grad).all()

    h64 = case.hidden.double().requires_grad_()
    w64 = case.weight.double().requires_grad_()
    logp = torch.log_softmax(h64 @ w64.T, -1).gather(-1, case.tokens[:, None]).squeeze(-1)
    log_ratio = (logp.detach() - case.behavior.token_logprobs.double()).tolist()
    w, dropped, clipped = reference_weights(
        log_ratio,
        case.sequence_ids.tolist(),
        case.rmask.tolist(),
        region.correction,
        region.is_cap,
    )
    keep = out.keep.tolist()  # the mask, tested against its own references elsewhere
    n = sum(case.rmask.tolist())
    terms = [
        -case.advantages[t].item() * w[t] * keep[t] * logp[t]
        for t in range(N)
        if case.rmask[t] and w[t] != 0.0 and keep[t]
    ]
    want = sum(terms, torch.zeros((), dtype=torch.float64)) / max(n, 1)
    want.backward()
    assert h64.grad is not None and w64.grad is not None
    grad = max(
        float((hidden.grad.double() - h64.grad).abs().max()),
        float((weight.grad.double() - w64.grad).abs().max()),
    )
    masked, clip = sum(dropped) / max(n, 1), sum(clipped) / max(n, 1)
    assert out.stats["correction_masked_fraction"] == pytest.approx(masked, abs=1e-6)
    assert out.stats["correction_clipped_fraction"] == pytest.approx(clip, abs=1e-6)
    return Difference(float(abs(out.loss.detach().double() - want.detach())), grad, masked, clip)


LOSS_TOL, GRAD_TOL = 1e-6, 1e-6


@pytest.fixture(autouse=True)
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Vocabulary chunks of 37 columns, 20 rows: the fused sums cross many chunks."""
    monkeypatch.setattr(fused_module, "VOCAB_CHUNK", 37)
    monkeypatch.setattr(fused_module, "CHUNK_ELEMENTS", 37 * 20)


@pytest.mark.parametrize("fused", [False, True], ids=["logits", "fused"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("option", OPTIONS)
def test_loss_and_gradient_are_the_float64_reference(option: str, mask: str, fused: bool) -> None:
    case = make_case()
    diff = compare(case, region_of(OPTIONS[option], mask), fused=fused)
    assert diff.loss < LOSS_TOL and diff.grad < GRAD_TOL, diff
    if option.startswith(("mis", "icepop", "geo_rs")):
        assert 0 < diff.correction_masked < 1, "the correction must drop some tokens, not all"
    if option.startswith(("tis", "cispo")) or "is_cap" in option:
        assert 0 < diff.correction_clipped < 1, "the correction must clip some weights"


@pytest.mark.parametrize("fused", [False, True], ids=["logits", "fused"])
@pytest.mark.parametrize("option", DROPS_ALL)
def test_a_correction_that_drops_everything_gives_zero_loss_and_gradient(
    option: str, fused: bool
) -> None:
    case = make_case(1, above_one=True)
    region = region_of(DROPS_ALL[option], "dppo")
    hidden = case.hidden.clone().requires_grad_()
    proj = ProjectedLogits(hidden, case.weight)
    out = policy_loss(
        proj if fused else proj.materialize(),
        case.tokens,
        case.behavior,
        case.advantages,
        region,
        response_mask=case.rmask,
        sequence_ids=case.sequence_ids,
    )
    out.loss.backward()
    assert out.stats["correction_masked_fraction"] == 1.0
    assert float(out.loss.detach()) == 0.0
    assert hidden.grad is not None and torch.equal(hidden.grad, torch.zeros_like(hidden))
    assert all(math.isfinite(v) for v in out.stats.values())


@pytest.mark.parametrize("option", OPTIONS)
def test_an_empty_response_mask_gives_zero_loss_and_no_nan(option: str) -> None:
    case = make_case(2)
    hidden = case.hidden.clone().requires_grad_()
    out = policy_loss(
        ProjectedLogits(hidden, case.weight).materialize(),
        case.tokens,
        case.behavior,
        case.advantages,
        region_of(OPTIONS[option], "predictive"),
        response_mask=torch.zeros(N, dtype=torch.bool),
        sequence_ids=case.sequence_ids,
    )
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0
    assert hidden.grad is not None and torch.equal(hidden.grad, torch.zeros_like(hidden))
    assert out.stats["correction_masked_fraction"] == out.stats["correction_clipped_fraction"] == 0


TIES = [0.0, 0.0, 0.5, -0.5, 0.9, 1e-6, -1e-6, 50.0, 50.0, 0.0]
"""Log-ratios at the limits below: r = 1 exactly (the band [1, 1], the cap 1, is_cap 1) in a
sequence whose product is 1, a sequence of one token (its geometric mean is its ratio), ratios a
hair past 1 on either side (1e-6: exp keeps them off 1 in fp32 as in float64), and a sequence
whose product overflows fp32 (e^100)."""


@pytest.mark.parametrize(
    "correction",
    [
        Correction(type="none"),
        Correction(type="tis", cap=1.0),
        Correction(type="tis", level="sequence", cap=1.0),
        Correction(type="mis", cap=1.0),
        Correction(type="mis", level="sequence", cap=1.0),
        Correction(type="icepop", low=1.0, high=1.0),
        Correction(type="icepop", low=0.5, high=2.0),
        Correction(type="geo_rs", level="sequence", low=1.0, high=1.0),
        Correction(type="geo_rs", level="sequence", low=0.5, high=2.0),
        Correction(type="cispo", low=1.0, high=1.0),
        Correction(type="cispo", low=0.5, high=2.0),
    ],
    ids=[
        "none",
        "tis_cap_1",
        "tis_sequence_cap_1",
        "mis_cap_1",
        "mis_sequence_cap_1",
        "icepop_band_1",
        "icepop",
        "geo_rs_band_1",
        "geo_rs",
        "cispo_band_1",
        "cispo",
    ],
)
def test_weights_at_the_limits_are_the_reference(correction: Correction) -> None:
    """Ties with the cap and the band's ends: kept, not clipped (the definitions' <=)."""
    lr = torch.tensor(TIES, dtype=torch.float32)
    seq = torch.tensor([0, 0, 1, 1, 2, 3, 3, 4, 4, 5])
    rmask = torch.tensor([True] * 9 + [False])
    got = correction_weights(lr, correction, is_cap=1.0, response_mask=rmask, sequence_ids=seq)
    w, dropped, clipped = reference_weights(
        lr.double().tolist(), seq.tolist(), rmask.tolist(), correction, 1.0
    )
    torch.testing.assert_close(got.weight.double(), torch.tensor(w, dtype=torch.float64))
    assert got.dropped.tolist() == dropped
    assert got.clipped.tolist() == clipped
    assert torch.isfinite(got.weight).all()


def test_sequence_levels_need_the_sequences() -> None:
    case = make_case()
    region = region_of(OPTIONS["tis_sequence"], "dppo")
    with pytest.raises(ValueError, match="sequence level needs sequence_ids"):
        policy_loss(case.logits(), case.tokens, case.behavior, case.advantages, region)
    with pytest.raises(ValueError, match=r"sequence_ids must be \(N=240,\), got \(3,\)"):
        policy_loss(
            case.logits(),
            case.tokens,
            case.behavior,
            case.advantages,
            region,
            sequence_ids=torch.zeros(3, dtype=torch.long),
        )


def test_the_default_is_bit_for_bit_the_is_cap_loss() -> None:
    """A spec without `correction` trains as before: the default correction's loss and gradient
    equal, bit for bit, the formula the loss had (A * min(r, is_cap) * m * log pi(a))."""
    case = make_case(3)
    region = TrustRegion.from_config(AlgorithmConfig.model_validate({"is_cap": 1.3}))
    logits = case.logits().requires_grad_()
    out = policy_loss(
        logits, case.tokens, case.behavior, case.advantages, region, response_mask=case.rmask
    )
    out.loss.backward()
    before = logits.detach().clone().requires_grad_()
    logp = -torch.nn.functional.cross_entropy(before, case.tokens, reduction="none")
    w = out.log_ratio.exp().clamp(max=1.3)
    terms = case.advantages * w * out.keep * case.rmask
    want = -((terms * logp) * case.rmask).sum() / case.rmask.sum()
    want.backward()
    assert torch.equal(out.loss.detach(), want.detach())
    assert before.grad is not None and torch.equal(logits.grad, before.grad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("correction", "error"),
    [
        ({"type": "tis", "cap": 0.999}, "correction.tis.cap"),
        ({"type": "tis", "cap": 1e12 * 1.001}, "correction.tis.cap"),
        ({"type": "tis", "cap": 1e12 + 0.5}, "correction.tis.cap"),
        ({"type": "icepop", "high": 1e12 + 0.5}, "correction.icepop.high"),
        ({"type": "geo_rs", "low": 1.001}, "correction.geo_rs.low"),
        ({"type": "cispo", "eps_high": 1e6 + 0.5}, "correction.cispo.eps_high"),
        ({"type": "mis", "cap": 0.999}, "correction.mis.cap"),
        ({"type": "mis", "level": "word"}, "correction.mis.level"),
        ({"type": "icepop", "low": 0.0}, "correction.icepop.low"),
        ({"type": "icepop", "low": 1.001}, "correction.icepop.low"),
        ({"type": "icepop", "high": 0.999}, "correction.icepop.high"),
        ({"type": "icepop", "level": "sequence"}, "correction.icepop.level"),
        ({"type": "geo_rs", "low": 0.0}, "correction.geo_rs.low"),
        ({"type": "geo_rs", "high": 0.999}, "correction.geo_rs.high"),
        ({"type": "geo_rs", "high": 100.001}, "correction.geo_rs.high"),
        ({"type": "cispo", "eps_low": -0.001}, "correction.cispo.eps_low"),
        ({"type": "cispo", "eps_low": 1.001}, "correction.cispo.eps_low"),
        ({"type": "cispo", "eps_high": -0.001}, "correction.cispo.eps_high"),
        ({"type": "cispo", "cap": 2.0}, "correction.cispo.cap"),
        ({"type": "trpo"}, "correction"),
        ({"type": "tis", "cap": math.nan}, "correction.tis.cap"),
    ],
)
def test_a_value_past_a_limit_is_refused_with_its_field(
    correction: dict[str, Any], error: str
) -> None:
    with pytest.raises(ValidationError) as info:
        AlgorithmConfig.model_validate({"correction": correction})
    located = {".".join(str(p) for p in e["loc"]) for e in info.value.errors()}
    assert error in located, located


@pytest.mark.parametrize(
    "correction",
    [
        {"type": "tis", "cap": 1.0},
        {"type": "tis", "cap": 1e12},
        {"type": "mis", "cap": 1.0, "level": "sequence"},
        {"type": "icepop", "low": 1.0, "high": 1.0},
        {"type": "icepop", "low": 1e-9, "high": 1e12},
        {"type": "geo_rs", "low": 1.0, "high": 1.0},
        {"type": "geo_rs", "low": 1e-9, "high": 100.0},
        {"type": "cispo", "eps_low": 0.0, "eps_high": 0.0},
        {"type": "cispo", "eps_low": 1.0, "eps_high": 1e6},
    ],
)
def test_a_value_at_a_limit_is_accepted(correction: dict[str, Any]) -> None:
    got = AlgorithmConfig.model_validate({"correction": correction}).correction
    assert {k: v for k, v in got.model_dump().items() if k in correction} == correction


@pytest.mark.parametrize("kind", ["tis", "mis", "icepop", "cispo"])
def test_is_cap_beside_a_correction_with_its_own_weight_is_refused(kind: str) -> None:
    with pytest.raises(ValidationError, match=f"is_cap=2 and correction.type='{kind}' both"):
        AlgorithmConfig.model_validate({"is_cap": 2.0, "correction": {"type": kind}})
    # at the default it is no second weight, and none and geo_rs take any cap
    AlgorithmConfig.model_validate({"is_cap": 1e4, "correction": {"type": kind}})
    for own in ("none", "geo_rs"):
        AlgorithmConfig.model_validate({"is_cap": 2.0, "correction": {"type": own}})


def table() -> str:
    """The largest differences from the float64 reference per correction, over every mask and
    both loss paths (the issue's must-show table)."""
    import core.objective.fused as fm

    fm.VOCAB_CHUNK, fm.CHUNK_ELEMENTS = 37, 37 * 20
    case = make_case()
    lines = [
        f"case: N={N} tokens, V={V}, H={H}, K={K}, {TRUNCATED_ROWS} rows with -inf in the view, "
        "3 tied vocabulary rows, sequences of 1-37 tokens; masks "
        + ", ".join(MASKS)
        + "; paths: logits and fused",
        f"{'correction':<22} {'max |loss diff|':>16} {'max |grad diff|':>16} "
        f"{'dropped':>8} {'clipped':>8}",
    ]
    for name, option in OPTIONS.items():
        diffs = [
            compare(case, region_of(option, mask), fused=fused)
            for mask in MASKS
            for fused in (False, True)
        ]
        lines.append(
            f"{name:<22} {max(d.loss for d in diffs):>16.2e} {max(d.grad for d in diffs):>16.2e} "
            f"{diffs[0].correction_masked:>8.3f} {diffs[0].correction_clipped:>8.3f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())


@pytest.mark.parametrize("kind", ["tis", "mis", "icepop"])
def test_the_cores_defaults_are_the_configs(kind: str) -> None:
    """A `Correction` built directly (benches, tests) is what a spec naming only the type gets."""
    config = AlgorithmConfig.model_validate({"correction": {"type": kind}}).correction
    assert Correction(type=kind) == Correction.from_config(config)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"type": "trpo"}, r"correction type must be one of \('none', 'tis'"),
        ({"type": "tis", "level": "word"}, r"correction level must be one of \('token', "),
        ({"type": "icepop", "level": "sequence"}, "'icepop' is token level, got 'sequence'"),
        ({"type": "cispo", "level": "sequence"}, "'cispo' is token level, got 'sequence'"),
        ({"type": "geo_rs"}, "'geo_rs' is sequence level, got 'token'"),
        ({"type": "tis", "cap": 0.0}, "correction cap must be > 0, got 0.0"),
        ({"type": "tis", "cap": -1e-9}, "correction cap must be > 0, got -1e-09"),
        ({"type": "icepop", "low": -1e-9}, r"0 <= low <= high, got \[-1e-09, 5.0\]"),
        ({"type": "icepop", "low": 1.5, "high": 1.0}, r"0 <= low <= high, got \[1.5, 1.0\]"),
    ],
)
def test_a_correction_past_a_limit_is_refused_by_the_core(args: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Correction(**args)


@pytest.mark.parametrize(
    "args",
    [
        {"type": "tis", "cap": 1e-9},
        {"type": "icepop", "low": 0.0, "high": 0.0},
        {"type": "icepop", "low": 1.0, "high": 1.0},
        {"type": "geo_rs", "level": "sequence", "low": 0.5, "high": 0.5},
        {"type": "mis", "level": "sequence"},
    ],
)
def test_a_correction_at_a_limit_is_accepted_by_the_core(args: dict[str, Any]) -> None:
    assert Correction(**args).type == args["type"]


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ({"type": "none"}, Correction(type="none")),
        ({"type": "tis", "cap": 3.0}, Correction(type="tis", cap=3.0)),
        (
            {"type": "mis", "level": "sequence", "cap": 1.5},
            Correction(type="mis", level="sequence", cap=1.5),
        ),
        ({"type": "icepop", "low": 0.4, "high": 3.0}, Correction(type="icepop", low=0.4, high=3.0)),
        (
            {"type": "geo_rs", "low": 0.99, "high": 1.02},
            Correction(type="geo_rs", level="sequence", low=0.99, high=1.02),
        ),
        (  # MiniMax-M1's band: [1 - eps_low, 1 + eps_high]
            {"type": "cispo", "eps_low": 0.25, "eps_high": 0.5},
            Correction(type="cispo", low=0.75, high=1.5),
        ),
        ({"type": "cispo"}, Correction(type="cispo", low=0.0, high=1.28)),
        ({"type": "geo_rs"}, Correction(type="geo_rs", level="sequence", low=0.999, high=1.001)),
    ],
    ids=["none", "tis", "mis", "icepop", "geo_rs", "cispo", "cispo_defaults", "geo_rs_defaults"],
)
def test_each_spec_becomes_the_correction_it_names(spec: dict[str, Any], want: Correction) -> None:
    """The config's parameters reach the core as the formulas read them (the float64 reference
    above takes its band from the core's object, so this mapping is checked here)."""
    config = AlgorithmConfig.model_validate({"correction": spec}).correction
    assert Correction.from_config(config) == want


def test_the_weights_are_a_stop_gradient() -> None:
    """w is sg(...): no graph reaches it even from a log-ratio that has one."""
    lr = torch.tensor([0.1, -0.2, 3.0], requires_grad=True)
    got = correction_weights(
        lr,
        Correction(type="tis", cap=2.0),
        is_cap=1e4,
        response_mask=torch.ones(3, dtype=torch.bool),
    )
    assert not got.weight.requires_grad
    torch.testing.assert_close(got.weight, torch.tensor([0.1, -0.2, 0.69314718]).exp())


@pytest.mark.parametrize(
    "correction",
    [Correction(type="mis", level="sequence"), Correction(type="geo_rs", level="sequence")],
    ids=["mis_sequence", "geo_rs"],
)
def test_no_tokens_give_no_weights(correction: Correction) -> None:
    """An empty piece (a rank whose share has no response) has no sequence to sum over."""
    empty = torch.zeros(0)
    got = correction_weights(
        empty,
        correction,
        is_cap=1e4,
        response_mask=torch.zeros(0, dtype=torch.bool),
        sequence_ids=torch.zeros(0, dtype=torch.long),
    )
    assert got.weight.shape == got.dropped.shape == got.clipped.shape == (0,)


def test_the_weights_alone_need_the_sequences_at_sequence_level() -> None:
    """`correction_weights` called without the loss (the bench does) checks its own inputs."""
    lr, rmask = torch.zeros(4), torch.ones(4, dtype=torch.bool)
    tis = Correction(type="tis", level="sequence")
    with pytest.raises(ValueError, match="'tis' at sequence level needs sequence_ids"):
        correction_weights(lr, tis, is_cap=1e4, response_mask=rmask)
    with pytest.raises(ValueError, match=r"sequence_ids must be \(N=4,\), got \(3,\)"):
        correction_weights(
            lr, tis, is_cap=1e4, response_mask=rmask, sequence_ids=torch.zeros(3, dtype=torch.long)
        )
