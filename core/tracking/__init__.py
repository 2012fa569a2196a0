"""Runs reported to the experiment trackers users already look at: TensorBoard, MLflow, W&B.

`base`: what a tracker does (`Tracker`), where it reports (`TrackingOptions`, the operator's
settings: a spec names trackers, never their addresses or credentials), and the run it reports
to (`TrackerRun`); `channel`: one tracker's bounded queue and the thread that drains it, so that
a tracker that is down or slow never fails or stalls training; `reporter`: every tracker of a
run behind one object, its state on disk so that a resumed run continues the same tracker runs;
`tensorboard`, `mlflow`, `wandb`: one module per tracker, each importing its own library (an
optional extra, `core.extras`) only when a run asks for it.

Imports: `core.extras` (and each tracker's own library, lazily), nothing else from `core`.
"""

from core.tracking.base import TRACKERS as TRACKERS
from core.tracking.base import Tracker as Tracker
from core.tracking.base import TrackerRun as TrackerRun
from core.tracking.base import TrackingOptions as TrackingOptions
from core.tracking.reporter import Reporter as Reporter
