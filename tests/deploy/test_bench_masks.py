"""bench/masks.py's paired comparison: the per-seed differences against the baseline, their
bootstrap interval, and the seeds where only one of the two reached the threshold."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.masks import bootstrap_ci, final_reward, paired, steps_to  # noqa: E402


def rows(rewards: list[float]) -> list[dict[str, float]]:
    return [{"reward_mean": r} for r in rewards]


def test_bootstrap_of_equal_differences_is_that_difference() -> None:
    assert bootstrap_ci([0.25] * 7) == (0.25, 0.25, 0.25)


def test_bootstrap_interval_holds_the_mean_and_lies_within_the_data() -> None:
    diffs = [-0.2, 0.1, 0.3, 0.4, 0.0, 0.2]
    mean, lo, hi = bootstrap_ci(diffs)
    assert mean == sum(diffs) / 6
    assert -0.2 <= lo < mean < hi <= 0.4
    assert bootstrap_ci(diffs) == (mean, lo, hi)  # seeded


def test_final_reward_and_steps_to_threshold() -> None:
    curve = [0.0] * 10 + [1.0] * 10  # 20 steps: the last 10% are 2 steps
    assert final_reward(rows(curve)) == 1.0
    assert steps_to(curve, 0.8) == 14  # the first 5-step window with mean >= 0.8: steps 10-14
    assert steps_to([0.5] * 20, 0.8) is None


def test_paired_compares_seed_by_seed_with_the_baseline() -> None:
    late = [0.0] * 10 + [1.0] * 10  # reaches 0.8 at step 14, final 1.0
    early = [0.0] * 5 + [1.0] * 15  # at step 9, final 1.0
    never = [0.5] * 20  # never, final 0.5
    runs = {
        "base": {0: rows(late), 1: rows(late), 2: rows(never)},
        "other": {0: rows(early), 1: rows(early), 2: rows(late)},
    }
    table = paired(runs, "base", 0.8)
    line = table.splitlines()[-1].split()
    # final: 0, 0, +0.5 -> mean +0.167; steps: -5, -5 where both reached; seed 2 only "other"
    assert line[0] == "other" and line[1] == "3"
    # resampling {0, 0, 0.5}: a mean of 0 and one of 0.5 each have chance 8/27 and 1/27
    assert line[2:] == ["+0.167", "[+0.000,+0.500]", "-5.0", "[-5.0,-5.0]", "2/1/0"]
