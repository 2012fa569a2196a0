"""`algorithm.correction`: the off-policy correction of the loss, one model per type.

A discriminated union on `type` (as the graders' `type`), so that each correction takes only
its own parameters and a spec's typo is told against them. The formulas, their sources and when
to use each: `core.objective.corrections` and docs/users/corrections.md. Limits keep out what
would drop or down-weight the on-policy tokens themselves (r = 1): a cap below 1, a band that
leaves 1 out.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from core.config.types import FiniteFloat, Strict

Level = Literal["token", "sequence"]


class NoCorrection(Strict):
    type: Literal["none"] = Field(
        default="none",
        description="No correction beyond algorithm.is_cap: each token weighs min(pi/mu, is_cap).",
    )


class _Capped(Strict):
    """The fields TIS and MIS share: the level their ratio is taken at and its cap."""

    level: Level = Field(
        default="token",
        description=(
            "'token': each token's own ratio r_t; 'sequence': the product of the sequence's "
            "ratios, prod_t r_t, for every token of the sequence."
        ),
    )
    cap: FiniteFloat = Field(
        default=2.0, ge=1, le=1e12, description="C; at least 1 (on-policy tokens weigh 1)."
    )


class TisCorrection(_Capped):
    type: Literal["tis"] = Field(
        description="Truncated importance sampling: each token weighs min(ratio, cap)."
    )


class MisCorrection(_Capped):
    type: Literal["mis"] = Field(
        description=(
            "Masked importance sampling: a token (sequence) whose ratio exceeds cap is dropped, "
            "the others weigh their ratio."
        )
    )


class IcePopCorrection(Strict):
    type: Literal["icepop"] = Field(
        description="IcePop (Ring-1T): tokens whose r_t leaves [low, high] are dropped, the rest "
        "weigh r_t."
    )
    low: FiniteFloat = Field(default=0.5, gt=0, le=1, description="alpha, in (0, 1].")
    high: FiniteFloat = Field(default=5.0, ge=1, le=1e12, description="beta, at least 1.")


class GeoRsCorrection(Strict):
    type: Literal["geo_rs"] = Field(
        description=(
            "Geometric-mean rejection: a sequence whose exp(mean_t log r_t) leaves [low, high] "
            "is dropped whole; kept tokens weigh min(r_t, algorithm.is_cap)."
        )
    )
    low: FiniteFloat = Field(default=0.999, gt=0, le=1, description="Lower bound, in (0, 1].")
    high: FiniteFloat = Field(default=1.001, ge=1, le=100, description="Upper bound, in [1, 100].")


class CispoCorrection(Strict):
    type: Literal["cispo"] = Field(
        description=(
            "CISPO (MiniMax-M1): each token weighs clip(r_t, 1 - eps_low, 1 + eps_high) and "
            "none is dropped."
        )
    )
    eps_low: FiniteFloat = Field(
        default=1.0, ge=0, le=1, description="1 (the default, as MiniMax-M1): no lower clip."
    )
    eps_high: FiniteFloat = Field(
        default=0.28,
        ge=0,
        le=1e6,
        description=(
            "Upper clip 1 + this. MiniMax-M1 tunes only this one and gives no value; 0.28 is "
            "Trinity-RFT's CISPO default (and DAPO's clip-higher)."
        ),
    )


Correction = Annotated[
    NoCorrection
    | TisCorrection
    | MisCorrection
    | IcePopCorrection
    | GeoRsCorrection
    | CispoCorrection,
    Field(discriminator="type"),
]

OWN_WEIGHT = ("tis", "mis", "icepop", "cispo")
"""Types that set the kept tokens' weight themselves: algorithm.is_cap must stay unset."""
