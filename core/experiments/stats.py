"""What an experiment's runs say: each arm against the baseline, seed by seed.

The spread between seeds is often larger than the gap between arms, so arms are compared on the
seeds they share (seed s of every arm saw the same prompts and initial weights): the per-seed
differences of the final value, a percentile bootstrap interval of their mean and an exact sign
test (scipy's, not a hand-rolled resampler). An interval that holds 0 and a sign test near 1 are
no evidence either way.

Definitions, the same for the API's report and `bench/masks.py`:

- a run's values of a metric are its rows' finite numbers for it, in step order (rows without it,
  such as the steps between evaluations, are skipped);
- final: the mean of the last `final_fraction` of those values (at least one);
- steps to threshold: the step of the first row where the mean of the last 5 values reaches it;
- masked fraction: the mean of the metric `masked_fraction` over the whole run;
- paired seeds: the seeds that every arm with data ran to completion, where complete means as
  many values as the arm's longest run has (a child still running, or stopped early, beside
  finished siblings is left out of the comparison: its "final" is not the same step's).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

__all__ = ["Series", "curves", "report", "report_csv"]

Series = Mapping[str, Mapping[int, Sequence[Mapping[str, float]]]]
"""arm name -> seed -> that run's metric rows in step order (each with "step" and its metrics)."""

WINDOW = 5
"""Steps in the running mean that `steps_to_threshold` compares with the threshold."""

MASKED = "masked_fraction"


def _values(rows: Sequence[Mapping[str, float]], metric: str) -> list[tuple[int, float]]:
    """(step, value) of each row with a finite number for `metric` (NaN would not be JSON)."""
    out = []
    for row in rows:
        v = row.get(metric)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out.append((int(row["step"]), float(v)))
    return out


def _check_metric(series: Series, metric: str) -> None:
    """Refuse a metric no row has; runs with no rows yet (all queued) refuse nothing."""
    seen = {k for seeds in series.values() for rows in seeds.values() for r in rows for k in r}
    if seen and not any(_values(rows, metric) for s in series.values() for rows in s.values()):
        known = ", ".join(sorted(seen - {"step"}))
        raise ValueError(f"no run has the metric {metric!r}; the runs have: {known}")


def _final(values: list[tuple[int, float]], fraction: float) -> float:
    # the epsilon: 0.29 * 100 is 28.999999999999996 in floating point, and means 29
    k = max(1, math.floor(len(values) * fraction + 1e-9))
    return float(np.mean([v for _, v in values[-k:]]))


def _steps_to(values: list[tuple[int, float]], threshold: float) -> int | None:
    vs = [v for _, v in values]
    for i in range(WINDOW, len(vs) + 1):
        if float(np.mean(vs[i - WINDOW : i])) >= threshold:
            return values[i - 1][0]
    return None


def _ci(diffs: list[float], resamples: int, rng_seed: int) -> list[float] | None:
    """95% percentile bootstrap interval of the mean of paired differences. One seed: [d, d]
    (nothing to resample); none: None. Each call draws from a fresh generator seeded alike, so an
    arm's interval does not depend on which arms came before it."""
    if not diffs:
        return None
    if len(diffs) == 1:
        return [diffs[0], diffs[0]]
    res = stats.bootstrap(
        (np.asarray(diffs),),
        np.mean,
        n_resamples=resamples,
        method="percentile",
        confidence_level=0.95,
        random_state=np.random.default_rng(rng_seed),
    )
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


def _paired_diff(
    arm: Mapping[int, float], base: Mapping[int, float], seeds: list[int]
) -> dict[int, float]:
    return {s: arm[s] - base[s] for s in seeds if s in arm and s in base}


def report(
    series: Series,
    *,
    metric: str = "reward_mean",
    baseline: str,
    threshold: float | None = None,
    final_fraction: float = 0.1,
    resamples: int = 10_000,
    rng_seed: int = 0,
    arm_order: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Each arm's final value, steps to `threshold` and masked fraction, and its paired
    comparison with `baseline` (see the module docstring). JSON-ready: per-seed maps are keyed
    by the seed as a string. `arm_order`: the arms to report, in order (one without runs yet is
    reported empty); default: the series' arms in its order."""
    if not 0 < final_fraction <= 1:
        raise ValueError(f"final_fraction must be in (0, 1] (got {final_fraction})")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1 (got {resamples})")
    names = list(arm_order) if arm_order is not None else list(series)
    if baseline not in names:
        raise ValueError(f"baseline {baseline!r} is not an arm (arms: {', '.join(names)})")
    _check_metric(series, metric)

    values = {
        name: {
            seed: v
            for seed, rows in sorted(series.get(name, {}).items())
            if (v := _values(rows, metric))
        }
        for name in names
    }
    finals = {
        name: {seed: _final(v, final_fraction) for seed, v in runs.items()}
        for name, runs in values.items()
    }
    masked = {
        name: {
            seed: float(np.mean([v for _, v in m]))
            for seed, rows in sorted(series.get(name, {}).items())
            if (m := _values(rows, MASKED))
        }
        for name in names
    }
    complete: list[set[int]] = []
    for runs in values.values():
        if runs:
            longest = max(len(v) for v in runs.values())
            complete.append({seed for seed, v in runs.items() if len(v) == longest})
    paired = sorted(set.intersection(*complete)) if complete else []

    arms_out = []
    for name in names:
        runs = values[name]
        fin = finals[name]
        reach = (
            {seed: _steps_to(v, threshold) for seed, v in runs.items()}
            if threshold is not None
            else {}
        )
        hit = [s for s in reach.values() if s is not None]
        arms_out.append(
            {
                "name": name,
                "seeds": sorted(s for s, rows in series.get(name, {}).items() if rows),
                "final": {
                    "median": float(np.median(list(fin.values()))) if fin else None,
                    "min": min(fin.values()) if fin else None,
                    "max": max(fin.values()) if fin else None,
                    "per_seed": {str(s): v for s, v in fin.items()},
                },
                "steps_to_threshold": None
                if threshold is None
                else {
                    "reached": len(hit),
                    "of": len(reach),
                    # median_low: a step some seed reached it at, an int
                    "median": int(np.sort(hit)[(len(hit) - 1) // 2]) if hit else None,
                    "per_seed": {str(s): v for s, v in reach.items()},
                },
                "masked_fraction": {
                    "mean": float(np.mean(list(masked[name].values()))) if masked[name] else None,
                    "per_seed": {str(s): v for s, v in masked[name].items()},
                },
                "vs_baseline": None
                if name == baseline
                else _versus(
                    fin,
                    finals[baseline],
                    masked[name],
                    base_mask=masked[baseline],
                    paired=paired,
                    resamples=resamples,
                    rng_seed=rng_seed,
                ),
            }
        )
    return {
        "metric": metric,
        "baseline": baseline,
        "threshold": threshold,
        "final_fraction": final_fraction,
        "resamples": resamples,
        "paired_seeds": paired,
        "arms": arms_out,
    }


def _versus(
    fin: Mapping[int, float],
    base_fin: Mapping[int, float],
    mask: Mapping[int, float],
    base_mask: Mapping[int, float],
    paired: list[int],
    resamples: int,
    rng_seed: int,
) -> dict[str, Any]:
    diffs = _paired_diff(fin, base_fin, paired)
    d = list(diffs.values())
    wins, losses = sum(x > 0 for x in d), sum(x < 0 for x in d)
    mask_d = list(_paired_diff(mask, base_mask, paired).values())
    return {
        "note": _identical_note(d, [*mask.values(), *base_mask.values()]),
        "mean_diff": float(np.mean(d)) if d else None,
        "ci95": _ci(d, resamples, rng_seed),
        "per_seed": {str(s): v for s, v in diffs.items()},
        "sign_test": {
            "wins": wins,
            "losses": losses,
            "ties": len(d) - wins - losses,
            "p_value": float(stats.binomtest(wins, wins + losses, 0.5).pvalue)
            if wins + losses
            else None,
        },
        "masked_fraction_diff": {
            "mean_diff": float(np.mean(mask_d)),
            "ci95": _ci(mask_d, resamples, rng_seed),
        }
        if mask_d
        else None,
    }


def _identical_note(diffs: list[float], masked: list[float]) -> str | None:
    """Why a comparison says nothing, when every paired seed tied: a sign test of 0-0-n has
    p=None, and arms that could not differ (on-policy: pi == mu, no mask fires, so two masks
    compute the same run) are the usual cause, which the masked fractions show."""
    if not diffs or any(diffs):
        return None
    note = f"identical to the baseline on every paired seed ({len(diffs)} of {len(diffs)}): "
    if masked and not any(masked):
        return note + (
            "no mask fired in either arm (masked fraction 0 on every seed), so the arms could "
            "not differ; on-policy rollouts leave a trust region nothing to correct (set "
            "rollout.staleness, algorithm.minibatches or rollout.dtype to compare masks)"
        )
    return note + "no win or loss for the sign test to count"


CSV_COLUMNS = [
    "arm",
    "seed",
    "final",
    "final_min",
    "final_max",
    "steps_to_threshold",
    "reached",
    "masked_fraction",
    "diff",
    "diff_ci95_low",
    "diff_ci95_high",
    "wins",
    "losses",
    "ties",
    "p_value",
    "masked_fraction_diff",
]


def report_csv(rep: Mapping[str, Any]) -> str:
    """The report as a table for a spreadsheet: one row per (arm, seed) with that seed's values
    and its difference from the baseline, then one summary row per arm whose seed is "all":
    final is the median over seeds, steps_to_threshold the median of those that reached it,
    masked_fraction the mean, diff the mean difference with its interval and the sign test.
    Numbers at full precision (they parse back to the report's floats); empty cells for None."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    summaries = []
    for arm in rep["arms"]:
        steps, vs = arm["steps_to_threshold"], arm["vs_baseline"]
        seeds = sorted({*arm["final"]["per_seed"], *arm["masked_fraction"]["per_seed"]}, key=int)
        for seed in seeds:
            row = dict.fromkeys(CSV_COLUMNS)
            row.update(
                arm=arm["name"],
                seed=seed,
                final=arm["final"]["per_seed"].get(seed),
                steps_to_threshold=steps["per_seed"].get(seed) if steps else None,
                masked_fraction=arm["masked_fraction"]["per_seed"].get(seed),
                diff=vs["per_seed"].get(seed) if vs else None,
            )
            writer.writerow(_cells(row))
        row = dict.fromkeys(CSV_COLUMNS)
        row.update(
            arm=arm["name"],
            seed="all",
            final=arm["final"]["median"],
            final_min=arm["final"]["min"],
            final_max=arm["final"]["max"],
            steps_to_threshold=steps["median"] if steps else None,
            reached=f"{steps['reached']}/{steps['of']}" if steps else None,
            masked_fraction=arm["masked_fraction"]["mean"],
        )
        if vs:
            ci = vs["ci95"] or [None, None]
            mf = vs["masked_fraction_diff"]
            row.update(
                diff=vs["mean_diff"],
                diff_ci95_low=ci[0],
                diff_ci95_high=ci[1],
                **vs["sign_test"],
                masked_fraction_diff=mf["mean_diff"] if mf else None,
            )
        summaries.append(_cells(row))
    writer.writerows(summaries)
    return out.getvalue()


def _cells(row: Mapping[str, Any]) -> list[str]:
    return [
        "" if row[c] is None else repr(row[c]) if isinstance(row[c], float) else str(row[c])
        for c in CSV_COLUMNS
    ]


def curves(series: Series, metric: str) -> dict[str, dict[str, list[float]]]:
    """Each arm's curve over seeds: at every step that at least one seed has a value for, the
    median, min ("low") and max ("high") of the seeds that have one. So a seed still running
    ends its contribution where its rows end, and the band past that is the other seeds' alone
    (a curve cut to the shortest seed would hide the finished runs' ends while one is late)."""
    _check_metric(series, metric)
    out: dict[str, dict[str, list[float]]] = {}
    for name, seeds in series.items():
        at: dict[int, list[float]] = {}
        for rows in seeds.values():
            for step, v in _values(rows, metric):
                at.setdefault(step, []).append(v)
        steps = sorted(at)
        out[name] = {
            "step": [float(s) for s in steps],
            "median": [float(np.median(at[s])) for s in steps],
            "low": [min(at[s]) for s in steps],
            "high": [max(at[s]) for s in steps],
        }
    return out
