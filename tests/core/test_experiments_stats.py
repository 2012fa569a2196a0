"""The experiment report on hand-made runs whose answers are known: finals, paired differences,
the sign test and bootstrap interval (against scipy's own numbers), steps to a threshold, which
seeds count as paired, the CSV and the curves."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from scipy import stats

from core.experiments import curves, report, report_csv


def run(
    rewards: Sequence[float], masked: float | None = None, first: int = 1
) -> list[dict[str, float]]:
    """One run's metric rows, steps from `first`."""
    rows: list[dict[str, float]] = []
    for i, r in enumerate(rewards):
        row = {"step": float(first + i), "reward_mean": float(r), "loss": 0.5}
        if masked is not None:
            row["masked_fraction"] = masked
        rows.append(row)
    return rows


def flat(value: float, n: int = 20, masked: float | None = None) -> list[dict[str, float]]:
    return run([value] * n, masked)


def test_final_is_the_mean_of_the_last_tenth() -> None:
    rep = report({"a": {0: run(range(20)), 1: run(range(9)), 2: run(range(30))}}, baseline="a")
    final = rep["arms"][0]["final"]
    # 20 steps -> the last 2 (18, 19); 9 steps -> at least 1 (8); 30 steps -> the last 3
    assert final["per_seed"] == {"0": 18.5, "1": 8.0, "2": 28.0}
    assert (final["median"], final["min"], final["max"]) == (18.5, 8.0, 28.0)
    rep = report({"a": {0: run(range(20))}}, baseline="a", final_fraction=0.25)
    assert rep["arms"][0]["final"]["per_seed"] == {"0": 17.0}  # mean of 15..19
    rep = report({"a": {0: run(range(100))}}, baseline="a", final_fraction=0.29)
    assert rep["arms"][0]["final"]["per_seed"] == {"0": 85.0}  # 29 values (71..99), not 28


def test_paired_differences_and_sign_test_eight_wins() -> None:
    base = {s: flat(0.25 * s) for s in range(8)}
    arm = {s: flat(0.25 * s + 0.5 + 0.25 * (s % 2)) for s in range(8)}
    rep = report({"base": base, "arm": arm}, baseline="base")
    assert rep["paired_seeds"] == list(range(8))
    assert rep["arms"][0]["vs_baseline"] is None
    vs = rep["arms"][1]["vs_baseline"]
    assert vs["per_seed"] == {str(s): 0.5 + 0.25 * (s % 2) for s in range(8)}
    assert vs["mean_diff"] == 0.625
    assert vs["sign_test"] == {"wins": 8, "losses": 0, "ties": 0, "p_value": 0.0078125}


def test_sign_test_counts_ties_apart_and_matches_scipy() -> None:
    diffs = [0.5, 0.5, -0.25, 0.0, 1.0, -0.5, 0.25]
    base = {s: flat(1.0) for s in range(len(diffs))}
    arm = {s: flat(1.0 + d) for s, d in enumerate(diffs)}
    vs = report({"base": base, "arm": arm}, baseline="base")["arms"][1]["vs_baseline"]
    assert vs["sign_test"]["wins"] == 4 and vs["sign_test"]["losses"] == 2
    assert vs["sign_test"]["ties"] == 1
    assert vs["sign_test"]["p_value"] == stats.binomtest(4, 6, 0.5).pvalue == 0.6875


def test_ci_of_constant_differences_is_the_difference() -> None:
    base = {s: flat(0.5) for s in range(6)}
    arm = {s: flat(0.75) for s in range(6)}
    vs = report({"base": base, "arm": arm}, baseline="base")["arms"][1]["vs_baseline"]
    assert vs["ci95"] == [0.25, 0.25] and vs["mean_diff"] == 0.25


def test_ci_is_scipys_paired_percentile_bootstrap() -> None:
    """Two seeds with differences 0 and 1: the resampled means are 0, 0.5 or 1 with
    probabilities 1/4, 1/2, 1/4, so the 2.5th and 97.5th percentiles are exactly 0 and 1."""
    base = {0: flat(0.0), 1: flat(0.0)}
    arm = {0: flat(0.0), 1: flat(1.0)}
    vs = report({"b": base, "a": arm}, baseline="b")["arms"][1]["vs_baseline"]
    assert vs["ci95"] == [0.0, 1.0]
    diffs = [0.125, 0.375, -0.25, 0.5, 0.0625]
    base = {s: flat(1.0) for s in range(5)}
    arm = {s: flat(1.0 + d) for s, d in enumerate(diffs)}
    for seed in (0, 7):
        want = stats.bootstrap(
            (np.asarray(diffs),),
            np.mean,
            n_resamples=2000,
            method="percentile",
            random_state=np.random.default_rng(seed),
        ).confidence_interval
        rep = report({"b": base, "a": arm}, baseline="b", resamples=2000, rng_seed=seed)
        assert rep["arms"][1]["vs_baseline"]["ci95"] == [want.low, want.high]
        assert rep["resamples"] == 2000


def test_one_paired_seed_gives_a_point_interval_and_none_gives_none() -> None:
    one = report({"b": {0: flat(0.5)}, "a": {0: flat(0.25)}}, baseline="b")
    vs = one["arms"][1]["vs_baseline"]
    assert (vs["mean_diff"], vs["ci95"]) == (-0.25, [-0.25, -0.25])
    assert vs["sign_test"] == {"wins": 0, "losses": 1, "ties": 0, "p_value": 1.0}
    none = report({"b": {0: flat(0.5)}, "a": {1: flat(0.25)}}, baseline="b")
    vs = none["arms"][1]["vs_baseline"]
    assert none["paired_seeds"] == []
    assert (vs["mean_diff"], vs["ci95"], vs["per_seed"]) == (None, None, {})
    assert vs["sign_test"] == {"wins": 0, "losses": 0, "ties": 0, "p_value": None}
    tied = report({"b": {0: flat(0.5)}, "a": {0: flat(0.5)}}, baseline="b")
    assert tied["arms"][1]["vs_baseline"]["sign_test"]["p_value"] is None


def test_unpaired_and_unfinished_seeds_are_left_out_of_the_comparison() -> None:
    """Seed 2 only in the arm, seed 3 only in the baseline, seed 4 still running in the arm
    (10 of 20 rows): paired are 0 and 1. The arm's own finals still show seeds 2 and 4."""
    base = {0: flat(0.5), 1: flat(0.5), 3: flat(0.5), 4: flat(0.5)}
    arm = {0: flat(1.0), 1: flat(0.75), 2: flat(1.0), 4: flat(0.0, n=10)}
    rep = report({"b": base, "a": arm}, baseline="b")
    assert rep["paired_seeds"] == [0, 1]
    a = rep["arms"][1]
    assert a["seeds"] == [0, 1, 2, 4]
    assert a["final"]["per_seed"] == {"0": 1.0, "1": 0.75, "2": 1.0, "4": 0.0}
    assert a["vs_baseline"]["per_seed"] == {"0": 0.5, "1": 0.25}
    assert a["vs_baseline"]["mean_diff"] == 0.375


def test_an_arm_without_runs_does_not_unpair_the_others() -> None:
    rep = report(
        {"b": {0: flat(0.5)}, "a": {0: flat(1.0)}},
        baseline="b",
        arm_order=["a", "queued", "b"],
    )
    assert [a["name"] for a in rep["arms"]] == ["a", "queued", "b"]
    assert rep["paired_seeds"] == [0]
    queued = rep["arms"][1]
    assert queued["seeds"] == [] and queued["final"] == {
        "median": None,
        "min": None,
        "max": None,
        "per_seed": {},
    }
    assert queued["vs_baseline"]["mean_diff"] is None
    assert rep["arms"][0]["vs_baseline"]["mean_diff"] == 0.5


def test_steps_to_threshold_uses_a_five_step_running_mean() -> None:
    # running means from step 5: 0.2, 0.4, 0.6, 0.8, 1.0
    climb = [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    spike = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]  # one step at 1: a 5-step mean of 0.2
    late = [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]  # 0.8 first at step 10
    series = {
        "a": {
            0: run(climb),
            1: run(spike),
            2: run(late),
            3: run(climb, first=101),
            4: run(climb, first=51),
        }
    }
    st = report(series, baseline="a", threshold=0.8)["arms"][0]["steps_to_threshold"]
    assert st["per_seed"] == {"0": 8, "1": None, "2": 10, "3": 108, "4": 58}
    # the lower median of 8, 10, 58, 108: a step some seed reached it at
    assert (st["reached"], st["of"], st["median"]) == (4, 5, 10)
    zero = report(series, baseline="a", threshold=0.0)["arms"][0]["steps_to_threshold"]
    assert zero["per_seed"] == {"0": 5, "1": 5, "2": 5, "3": 105, "4": 55}
    assert report(series, baseline="a")["arms"][0]["steps_to_threshold"] is None
    short = report({"a": {0: run([1, 1, 1, 1])}}, baseline="a", threshold=0.5)
    assert short["arms"][0]["steps_to_threshold"]["per_seed"] == {"0": None}  # under 5 steps


def test_masked_fraction_mean_and_paired_difference() -> None:
    base = {s: flat(0.5, masked=0.125) for s in range(4)}
    arm = {s: flat(0.5, masked=0.125 + 0.0625 * s) for s in range(4)}
    rep = report({"b": base, "a": arm}, baseline="b")
    assert rep["arms"][0]["masked_fraction"] == {
        "mean": 0.125,
        "per_seed": {str(s): 0.125 for s in range(4)},
    }
    a = rep["arms"][1]
    assert a["masked_fraction"]["per_seed"] == {"0": 0.125, "1": 0.1875, "2": 0.25, "3": 0.3125}
    assert a["masked_fraction"]["mean"] == 0.21875
    mf = a["vs_baseline"]["masked_fraction_diff"]
    assert mf["mean_diff"] == 0.09375
    assert 0.0 <= mf["ci95"][0] < 0.09375 < mf["ci95"][1] <= 0.1875
    plain = report({"b": {0: flat(0.5)}, "a": {0: flat(0.5)}}, baseline="b")
    assert plain["arms"][1]["masked_fraction"] == {"mean": None, "per_seed": {}}
    assert plain["arms"][1]["vs_baseline"]["masked_fraction_diff"] is None


def test_a_sparse_metric_and_non_finite_values() -> None:
    """Evaluation metrics come every few steps, and a NaN is no number to average."""
    rows = [{"step": float(s), "loss": 1.0} for s in range(1, 21)]
    for s, v in ((5, 0.25), (10, 0.5), (15, float("nan")), (20, 0.75)):
        rows[s - 1]["eval_reward"] = v
    rep = report({"a": {0: rows}}, metric="eval_reward", baseline="a", final_fraction=0.7)
    # NaN skipped: 3 values, 0.7 of them -> the last 2 (0.5 and 0.75)
    assert rep["arms"][0]["final"]["per_seed"] == {"0": 0.625}
    assert curves({"a": {0: rows}}, "eval_reward")["a"]["step"] == [5.0, 10.0, 20.0]


def test_unknown_metric_and_bad_arguments_are_refused() -> None:
    series = {"b": {0: flat(0.5)}}
    with pytest.raises(ValueError, match=r"'reward'; the runs have: loss, reward_mean"):
        report(series, metric="reward", baseline="b")
    with pytest.raises(ValueError, match=r"'reward'; the runs have: loss, reward_mean"):
        curves(series, "reward")
    with pytest.raises(ValueError, match=r"baseline 'x' is not an arm \(arms: b\)"):
        report(series, baseline="x")
    with pytest.raises(ValueError, match=r"final_fraction must be in \(0, 1\]"):
        report(series, baseline="b", final_fraction=0.0)
    with pytest.raises(ValueError, match=r"final_fraction must be in \(0, 1\] \(got 1.5\)"):
        report(series, baseline="b", final_fraction=1.5)
    # the whole run is the largest fraction: the mean of all 20 steps
    whole = report({"b": {0: run(range(20))}}, baseline="b", final_fraction=1.0)
    assert whole["arms"][0]["final"]["per_seed"] == {"0": 9.5}
    with pytest.raises(ValueError, match=r"resamples must be at least 1 \(got 0\)"):
        report(series, baseline="b", resamples=0)
    # one resample is the least allowed, and answers (one paired seed: its point interval)
    one = report({"b": {0: flat(0.5)}, "a": {0: flat(0.25)}}, baseline="b", resamples=1)
    assert (one["resamples"], one["arms"][1]["vs_baseline"]["ci95"]) == (1, [-0.25, -0.25])
    # nothing ran yet: an empty report, not an error
    empty = report({"b": {}, "a": {}}, baseline="b")
    assert empty["paired_seeds"] == [] and empty["arms"][1]["vs_baseline"]["ci95"] is None


def _json_types(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_types(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_types(v) for v in value)
    return type(value) in (str, int, float, bool, type(None))


def test_report_is_json_ready() -> None:
    base = {s: flat(0.5, masked=0.125) for s in range(3)}
    arm = {s: run([0.25 * s] * 20, masked=0.25) for s in range(3)}
    rep = report({"b": base, "a": arm}, baseline="b", threshold=0.3)
    assert _json_types(rep)  # no numpy scalars
    assert json.loads(json.dumps(rep, allow_nan=False)) == rep
    assert list(rep) == [
        "metric",
        "baseline",
        "threshold",
        "final_fraction",
        "resamples",
        "paired_seeds",
        "arms",
    ]
    assert (rep["metric"], rep["baseline"], rep["threshold"]) == ("reward_mean", "b", 0.3)
    assert (rep["final_fraction"], rep["resamples"]) == (0.1, 10_000)


def test_report_csv_parses_back_to_the_same_numbers() -> None:
    base = {s: flat(0.5, masked=0.125) for s in range(3)}
    arm = {s: run([0.1 * s] * 20, masked=0.25) for s in range(3)}
    rep = report({"b": base, "a": arm}, baseline="b", threshold=0.15)
    rows = list(csv.DictReader(io.StringIO(report_csv(rep))))
    assert [(r["arm"], r["seed"]) for r in rows] == [
        ("b", "0"),
        ("b", "1"),
        ("b", "2"),
        ("a", "0"),
        ("a", "1"),
        ("a", "2"),
        ("b", "all"),
        ("a", "all"),
    ]
    a = rep["arms"][1]
    for r in rows[3:6]:
        assert float(r["final"]) == a["final"]["per_seed"][r["seed"]]
        assert float(r["diff"]) == a["vs_baseline"]["per_seed"][r["seed"]]
        assert float(r["masked_fraction"]) == a["masked_fraction"]["per_seed"][r["seed"]] == 0.25
    assert [r["steps_to_threshold"] for r in rows[3:6]] == ["", "", "5"]
    assert rows[0]["diff"] == ""  # the baseline faces no one
    summary = rows[7]
    vs = a["vs_baseline"]
    assert float(summary["final"]) == a["final"]["median"]
    assert (float(summary["final_min"]), float(summary["final_max"])) == (
        a["final"]["min"],
        a["final"]["max"],
    )
    assert (summary["steps_to_threshold"], summary["reached"]) == ("5", "1/3")
    assert float(summary["diff"]) == vs["mean_diff"]
    assert [float(summary["diff_ci95_low"]), float(summary["diff_ci95_high"])] == vs["ci95"]
    assert (summary["wins"], summary["losses"], summary["ties"]) == ("0", "3", "0")
    assert float(summary["p_value"]) == vs["sign_test"]["p_value"] == 0.25
    assert float(summary["masked_fraction_diff"]) == 0.125
    assert float(rows[6]["final"]) == 0.5 and rows[6]["diff"] == ""


def test_curves_median_and_band_over_three_seeds() -> None:
    series = {"a": {0: run([1, 2, 3]), 1: run([2, 4, 6]), 2: run([3, 0, 9])}}
    assert curves(series, "reward_mean") == {
        "a": {
            "step": [1.0, 2.0, 3.0],
            "median": [2.0, 2.0, 6.0],
            "low": [1.0, 0.0, 3.0],
            "high": [3.0, 4.0, 9.0],
        }
    }


def test_curves_of_seeds_of_unequal_length_use_the_seeds_that_have_each_step() -> None:
    """Seed 2 is still running at step 2: steps 3 and 4 are seeds 0 and 1 alone."""
    series = {
        "a": {0: run([1, 2, 3, 4]), 1: run([2, 4, 6, 10]), 2: run([3, 0])},
        "queued": {},
    }
    assert curves(series, "reward_mean") == {
        "a": {
            "step": [1.0, 2.0, 3.0, 4.0],
            "median": [2.0, 2.0, 4.5, 7.0],
            "low": [1.0, 0.0, 3.0, 4.0],
            "high": [3.0, 4.0, 6.0, 10.0],
        },
        "queued": {"step": [], "median": [], "low": [], "high": []},
    }


@pytest.mark.parametrize(
    ("arm", "base", "note"),
    [
        # on-policy: pi == mu, so no mask fires and two masks compute the same run
        (
            flat(0.5, masked=0.0),
            flat(0.5, masked=0.0),
            "identical to the baseline on every paired seed (2 of 2): no mask fired in either "
            "arm (masked fraction 0 on every seed), so the arms could not differ; on-policy "
            "rollouts leave a trust region nothing to correct (set rollout.staleness, "
            "algorithm.minibatches or rollout.dtype to compare masks)",
        ),
        (
            flat(0.5, masked=0.125),
            flat(0.5, masked=0.0625),
            "identical to the baseline on every paired seed (2 of 2): no win or loss for the "
            "sign test to count",
        ),
        (
            flat(0.5),
            flat(0.5),
            "identical to the baseline on every paired seed (2 of 2): no win or loss for the "
            "sign test to count",
        ),
        (flat(0.5, masked=0.0), flat(0.25, masked=0.0), None),
    ],
)
def test_an_arm_identical_to_the_baseline_says_why(
    arm: list[dict[str, float]], base: list[dict[str, float]], note: str | None
) -> None:
    """Arms that can never differ (on-policy, so no mask fires) gave identical finals, a sign
    test of 0-0-2 and `p=-`, with no word of why."""
    rep = report({"b": {0: base, 1: base}, "a": {0: arm, 1: arm}}, baseline="b")
    assert rep["arms"][1]["vs_baseline"]["note"] == note
    tied = {"wins": 0, "losses": 0, "ties": 2, "p_value": None}
    assert (rep["arms"][1]["vs_baseline"]["sign_test"] == tied) == (note is not None)


def test_one_paired_seed_apart_is_no_identical_arm() -> None:
    rep = report(
        {"b": {0: flat(0.5), 1: flat(0.5)}, "a": {0: flat(0.5), 1: flat(0.75)}}, baseline="b"
    )
    assert rep["arms"][1]["vs_baseline"]["note"] is None
    assert rep["arms"][1]["vs_baseline"]["sign_test"]["ties"] == 1
