"""Where does uncorrected training break? Regimes of growing off-policy mismatch, walked one axis
at a time, with the collapse rate of each arm (issue 52, item 2).

The uncorrected arm is `algorithm.mask: none` with the default `is_cap` (1e4): its loss is
`-A * sg(pi/mu) * log pi(a)` on every token, the importance weight with no mask and (at 1e4) no
cap, so nothing limits how far a stale or low-precision sample pulls the policy.

Collapse, fixed before any run of this bench (in the commit that added this definition, ahead of
the code that runs it). A run collapses when

1. any step's metrics are not finite (the trainer stops such a run with FloatingPointError), or
2. its reward at the end is below its reward at the start by more than `COLLAPSE_MARGIN` (0.05,
   rewards lie in [0, 1]):
   - chat-math: the held-out reward after the last step (`eval_reward_mean`) against the
     held-out reward of the same policy before the first RL step (`start_eval_reward_mean`,
     after the supervised warm-up), both over the 50 held-out questions x `--eval-samples`;
   - reverse (builtin:tiny, which has no held-out set): the training reward, the mean of the
     last 10% of steps, against the first step's (the policy right after its warm-up, 128
     samples).

A regime breaks the uncorrected run when at least half of its seeds collapse. Why 0.05: the
held-out reward of one policy is a mean of 800 graded samples (50 x 16), whose standard error is
about 0.01, and in the 16-seed run where nothing was stressed the seeds' final held-out rewards
spread over 0.284-0.354 (bench/results/masks-chat-math-e518c19.txt); a drop of 0.05 below the
run's own start is then no sampling accident but training that made the policy worse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

COLLAPSE_MARGIN = 0.05
"""How far the end reward may fall below the start reward before the run counts as collapsed."""

FINAL_FRACTION = 0.1
"""The training reward's end value (reverse): the mean of this last share of the steps."""


def collapsed(start: float, end: float, margin: float = COLLAPSE_MARGIN) -> bool:
    """Whether a run whose reward went from `start` to `end` collapsed: a non-finite value, or
    an end more than `margin` below the start (the module docstring's criterion)."""
    if not (math.isfinite(start) and math.isfinite(end)):
        return True
    return end < start - margin


def start_and_end(rows: Sequence[dict[str, float]], held_out: bool) -> tuple[float, float]:
    """The start and end reward of a run's metrics rows: the held-out evaluations before the
    first step and after the last (`held_out`, chat-math, rows joined as bench/masks.py does),
    or the first step's training reward and the mean of the last `FINAL_FRACTION` of steps."""
    if not rows:
        return math.nan, math.nan
    if held_out:
        return rows[0].get("start_eval_reward_mean", math.nan), rows[-1].get(
            "eval_reward_mean", math.nan
        )
    last = max(1, round(len(rows) * FINAL_FRACTION))
    tail = [r["reward_mean"] for r in rows[-last:]]
    return rows[0]["reward_mean"], sum(tail) / len(tail)
