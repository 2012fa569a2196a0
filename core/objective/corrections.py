"""Off-policy corrections: the per-token weight w that replaces the loss's sg(min(pi/mu, c)).

    loss = - A * sg(w) * m * log pi(a)         m: the trust-region mask (`core.objective.masks`)

The trust-region mask decides from a divergence which tokens keep their gradient; a correction
decides from the sampled ratio r = pi(a) / mu(a) how much each token's gradient weighs, and may
drop tokens (or whole sequences) of its own. The two multiply, so any correction combines with
any mask (prime-rl's default loss is the DPPO mask times a clamped IS weight).

| type     | level    | weight w of a kept token         | dropped (w = 0)                        |
|----------|----------|----------------------------------|----------------------------------------|
| `none`   | token    | min(r_t, is_cap)  (pdppo's loss) | never                                  |
| `tis`    | token    | min(r_t, C)                      | never                                  |
| `tis`    | sequence | min(prod_t r_t, C)               | never                                  |
| `mis`    | token    | r_t                              | r_t > C                                |
| `mis`    | sequence | prod_t r_t                       | prod_t r_t > C (the whole sequence)    |
| `icepop` | token    | r_t                              | r_t outside [low, high]                |
| `geo_rs` | sequence | min(r_t, is_cap)                 | exp(mean_t log r_t) outside [low, high] |
| `cispo`  | token    | clip(r_t, low, high)             | never                                  |

Sources (definitions read there, code written here from the formulas):
- TIS and its sequence level, MIS, Geo-RS: verl `docs/algo/rollout_corr_math.md` (§3.3 IS
  aggregation, §3.4 rejection sampling, geometric aggregation "for rejection only") and Liu, Li
  et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
  Training-Inference Mismatch" (MIS: w = rho * 1[rho <= C], token and sequence level);
- IcePop: Ling team, "Every Step Evolves: Scaling RL for Trillion-Scale Thinking Model"
  (Ring-1T, arXiv 2510.18855): M(k) = k if k in [alpha, beta] else 0, k the train/infer ratio;
- CISPO: MiniMax-M1 (arXiv 2506.13585), eq. 4-5: sg(clip(r, 1 - eps_low, 1 + eps_high)) * A *
  log pi, every token keeps a gradient.

pdppo anchors r to the rollout policy mu itself (no recomputed old policy, as DPPO), so the
train/infer ratio of IcePop, MIS and Geo-RS and the PPO ratio of CISPO are the same r here.

Sequences: the loss sees flat response tokens; `sequence_ids` (N,) says which sequence each
belongs to (`core.training.update` numbers a piece's rows). Products and means run over the
response tokens of a sequence only. Everything is no-grad fp32 (w is a stop-gradient weight)
and finite wherever the response mask is set (inf * 0 would be NaN in the loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor

CorrectionType = Literal["none", "tis", "mis", "icepop", "geo_rs", "cispo"]
CORRECTION_TYPES: tuple[str, ...] = get_args(CorrectionType)
Level = Literal["token", "sequence"]
LEVELS: tuple[str, ...] = get_args(Level)

USES_IS_CAP = ("none", "geo_rs")
"""The types whose kept tokens weigh min(r, is_cap): the others set the weight themselves."""

LEVELLED = ("tis", "mis")
"""The types that come at both levels; IcePop and CISPO are token level, Geo-RS sequence level."""


@dataclass(frozen=True, kw_only=True)
class Correction:
    """One correction, its type and parameters: `cap` is C of `tis`/`mis`, [`low`, `high`] the
    band of `icepop`, `geo_rs` and (as 1 - eps_low, 1 + eps_high) `cispo`. The defaults are the
    config's for TIS, MIS and IcePop (a bench or test that builds one directly gets what a spec
    would). Checked here for what would break the arithmetic (a type or level it does not know,
    a cap <= 0, a band upside down); the config's limits (`core.config.corrections`) are
    stricter."""

    type: CorrectionType = "none"
    level: Level = "token"
    cap: float = 2.0
    low: float = 0.5
    high: float = 5.0

    def __post_init__(self) -> None:
        if self.type not in CORRECTION_TYPES:
            raise ValueError(
                f"correction type must be one of {CORRECTION_TYPES}, got {self.type!r}"
            )
        if self.level not in LEVELS:
            raise ValueError(f"correction level must be one of {LEVELS}, got {self.level!r}")
        fixed = {"icepop": "token", "cispo": "token", "geo_rs": "sequence"}.get(self.type)
        if fixed is not None and self.level != fixed:
            raise ValueError(f"correction {self.type!r} is {fixed} level, got {self.level!r}")
        if self.cap <= 0:
            raise ValueError(f"correction cap must be > 0, got {self.cap}")
        if not 0 <= self.low <= self.high:
            raise ValueError(
                f"correction band needs 0 <= low <= high, got [{self.low}, {self.high}]"
            )

    @property
    def per_sequence(self) -> bool:
        """Whether the weight needs the tokens' sequences (`sequence_ids`)."""
        return self.level == "sequence"

    @classmethod
    def from_config(cls, config: Any) -> Correction:
        """The correction of an `algorithm.correction` config (read by attribute name: this
        package imports nothing else of `core`); CISPO's eps_low / eps_high become the band."""
        kind: CorrectionType = config.type
        if kind == "cispo":
            low = 1.0 - float(config.eps_low)  # eps_low <= 1: never below 0
            return cls(type="cispo", low=low, high=1.0 + float(config.eps_high))
        args = {
            name: getattr(config, name)
            for name in ("level", "cap", "low", "high")
            if hasattr(config, name)
        }
        if kind == "geo_rs":
            args["level"] = "sequence"
        return cls(type=kind, **args)


NO_CORRECTION = Correction()


@dataclass(frozen=True)
class CorrectionWeights:
    """A correction's verdict on N tokens, all detached: `weight` (N,) fp32, 0 on dropped tokens
    and outside the response; `dropped` the tokens it removed; `clipped` the kept tokens whose
    weight it truncated (r past a cap or outside a clip band)."""

    weight: Tensor
    dropped: Tensor
    clipped: Tensor


def _per_sequence(values: Tensor, sequence_ids: Tensor, rmask: Tensor) -> tuple[Tensor, Tensor]:
    """(sum of `values` over each token's sequence, that sequence's response-token count), both
    (N,), counting response tokens only."""
    n_seq = int(sequence_ids.max()) + 1 if sequence_ids.numel() else 0
    zero = torch.zeros(n_seq, dtype=values.dtype, device=values.device)
    sums = zero.index_add(0, sequence_ids, torch.where(rmask, values, 0.0))
    counts = zero.index_add(0, sequence_ids, rmask.to(values.dtype))
    return sums[sequence_ids], counts[sequence_ids]


@torch.no_grad()
def correction_weights(
    log_ratio: Tensor,
    correction: Correction,
    *,
    is_cap: float,
    response_mask: Tensor,
    sequence_ids: Tensor | None = None,
) -> CorrectionWeights:
    """The weights of `correction` (module docstring) for tokens of log-ratio
    log pi(a) - log mu(a) (N,); `is_cap` is the trust region's cap, which `none` and `geo_rs`
    apply to the kept tokens. `sequence_ids` (N,) int64 is needed by the sequence-level types."""
    lr = log_ratio.float()
    rmask = response_mask.bool()
    if correction.per_sequence:
        if sequence_ids is None:
            raise ValueError(
                f"correction {correction.type!r} at sequence level needs sequence_ids, the (N,) "
                "sequence index of every token"
            )
        if sequence_ids.shape != lr.shape:
            raise ValueError(
                f"sequence_ids must be (N={lr.shape[0]},), got {tuple(sequence_ids.shape)}"
            )
    ratio = lr.exp()
    never = torch.zeros_like(rmask)
    kind, cap = correction.type, correction.cap
    if kind in USES_IS_CAP:
        weight, dropped, clipped = ratio.clamp(max=is_cap), never, ratio > is_cap
        if kind == "geo_rs":
            assert sequence_ids is not None
            sums, counts = _per_sequence(lr, sequence_ids, rmask)
            geo = (sums / counts.clamp_min(1.0)).exp()
            dropped = (geo < correction.low) | (geo > correction.high)
            clipped = clipped & ~dropped
    elif kind == "cispo":
        weight = ratio.clamp(min=correction.low, max=correction.high)
        dropped, clipped = never, (ratio < correction.low) | (ratio > correction.high)
    elif kind == "icepop":
        dropped = (ratio < correction.low) | (ratio > correction.high)
        weight, clipped = ratio, never
    else:  # tis, mis: the token's ratio, or its sequence's product broadcast to its tokens
        if correction.per_sequence:
            assert sequence_ids is not None
            ratio = _per_sequence(lr, sequence_ids, rmask)[0].exp()
        if kind == "tis":
            weight, dropped, clipped = ratio.clamp(max=cap), never, ratio > cap
        else:
            weight, dropped, clipped = ratio, ratio > cap, never
    keep = rmask & ~dropped
    return CorrectionWeights(
        weight=torch.where(keep, weight, 0.0), dropped=dropped & rmask, clipped=clipped & keep
    )
