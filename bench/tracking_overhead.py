"""What reporting to experiment trackers costs a run, per step: no tracker against each tracker
and all three, on the same `builtin:tiny` steps (tests/core's small config) in one process.

Two figures per setting. `hook us/step`: the time the training thread spends handing a step's
report over (`ReportingCallback.on_step` around the caller's own hook, median over the steps):
what training pays, since the trackers are driven by threads of their own. `ms/step`: the wall
time between consecutive steps (median), with those threads competing for the same cores: what
a run on a small machine sees, and noisy on a shared one. `close s`: how long the end of the
run waited for its last reports. MLflow reports to a local server (SQLite backend), started
here from `PDPPO_TEST_MLFLOW_SERVER` (see tests/support/mlflow.py) unless `--mlflow-uri`
names one; W&B runs offline.

    python bench/tracking_overhead.py                       # 30 steps, every setting, 2 repeats
    python bench/tracking_overhead.py --steps 50 --settings none,tensorboard
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SETTINGS = ("none", "tensorboard", "mlflow", "wandb", "all")


def one_run(setting: str, steps: int, mlflow_uri: str | None, root: Path) -> dict[str, float]:
    from core.tracking import TrackingOptions
    from core.training import reporting
    from core.training.callbacks import TrainerCallback
    from core.training.trainer import train
    from tests.support.trainer_runs import small_config

    trackers = {"none": [], "all": ["tensorboard", "mlflow", "wandb"]}.get(setting, [setting])
    config = small_config(steps=steps, checkpoint_every=0, report_to=trackers)
    hook: list[float] = []
    stamps: list[float] = []
    ended: list[float] = []

    class Clock(TrainerCallback):
        def on_step(self, step: int, metrics: dict[str, float]) -> None:
            stamps.append(time.perf_counter())

        def on_log(self, message: str) -> None:
            if message.startswith("final model saved"):
                ended.append(time.perf_counter())

    original = reporting.ReportingCallback.on_step

    def timed(self: Any, step: int, metrics: dict[str, float]) -> None:
        started = time.perf_counter()
        original(self, step, metrics)
        hook.append(time.perf_counter() - started)

    reporting.ReportingCallback.on_step = timed  # type: ignore[method-assign]
    try:
        options = TrackingOptions(mlflow_tracking_uri=mlflow_uri, wandb_mode="offline")
        out = Path(tempfile.mkdtemp(dir=root))
        train(config, out, callback=Clock(), tracking=options)
        done = time.perf_counter()
    finally:
        reporting.ReportingCallback.on_step = original  # type: ignore[method-assign]
    gaps = [b - a for a, b in itertools.pairwise(stamps[1:])]  # steps 3..: warm
    return {
        # no tracker: no ReportingCallback at all, the caller's callback as it is
        "hook_us": statistics.median(hook[2:]) * 1e6 if hook else 0.0,
        "step_ms": statistics.median(gaps) * 1e3,
        "close_s": done - ended[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--mlflow-uri", default=None)
    args = parser.parse_args()
    settings = [s for s in args.settings.split(",") if s]
    os.environ.setdefault("WANDB_SILENT", "true")
    import torch

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="tracking-bench-"))
    server = None
    uri = args.mlflow_uri
    if uri is None and any(s in ("mlflow", "all") for s in settings):
        from tests.support.mlflow import start_mlflow

        server = start_mlflow(root / "mlflow")
        uri = server.url
    try:
        rows: dict[str, list[dict[str, float]]] = {s: [] for s in settings}
        for _ in range(args.repeats):  # interleaved, so that every setting sees the same machine
            for setting in settings:
                rows[setting].append(one_run(setting, args.steps, uri, root))
    finally:
        if server is not None:
            server.stop()
    print(f"{args.steps} steps of tests/core's small config on builtin:tiny, 1 torch thread, ")
    print(f"medians over {args.repeats} runs of each setting's per-step medians")
    print(f"{'setting':<12} {'hook us/step':>13} {'ms/step':>9} {'close s':>8}")
    for setting, runs in rows.items():
        hook = statistics.median(r["hook_us"] for r in runs)
        step = statistics.median(r["step_ms"] for r in runs)
        close = statistics.median(r["close_s"] for r in runs)
        print(f"{setting:<12} {hook:>13.1f} {step:>9.1f} {close:>8.2f}")


if __name__ == "__main__":
    main()
