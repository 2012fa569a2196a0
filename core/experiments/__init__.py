"""Experiments: a grid of arms over a base job spec, each run on the same seeds, and the paired
statistics that compare them.

- `spec`: `ExperimentSpec` (base spec, grid of `train` paths, seeds, baseline), its `arms` and
  each (arm, seed)'s `child_spec`;
- `stats`: `report` (each arm against the baseline, seed by seed: bootstrap interval and sign
  test, from scipy), `report_csv` and `curves` (median and min-max band over seeds).

Pure Python with numpy and scipy: the API computes reports and loads no torch, and
`bench/masks.py` prints the same statistics from its own runs.

Imports: `core.config` (grid paths are checked against `TrainConfig`'s fields).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.experiments.spec import Arm, ExperimentSpec, arms, child_spec, seed_list

if TYPE_CHECKING:
    from core.experiments.stats import Series, curves, report, report_csv

_STATS = frozenset({"Series", "curves", "report", "report_csv"})


def __getattr__(name: str) -> Any:
    """The statistics load scipy (about 1 s) on first use: the API serves every other route,
    and starts, without it."""
    if name in _STATS:
        from core.experiments import stats

        return getattr(stats, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Arm",
    "ExperimentSpec",
    "Series",
    "arms",
    "child_spec",
    "curves",
    "report",
    "report_csv",
    "seed_list",
]
