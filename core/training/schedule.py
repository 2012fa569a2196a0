"""The learning rate of each RL step, as a pure function of the step.

No scheduler object holds state between steps: a run resumed from a checkpoint at step k sets
exactly the rate an uninterrupted run sets at step k, and there is nothing to save. (torch's
`LRScheduler` would have to be checkpointed and restored in step with the optimizer, and a
mismatch goes unnoticed.)

Steps are counted from 0 (the update of the run's first step) to `total_steps - 1`, the way
Hugging Face's `get_*_schedule_with_warmup` count them:

- warm-up, `step < lr_warmup_steps`: `lr * step / lr_warmup_steps` (0 at step 0, so the first
  update only primes AdamW's moments);
- then `constant` keeps `lr`; `linear` and `cosine` go from `lr` at the end of the warm-up to
  `lr * min_lr_ratio` at the last step, `total_steps - 1`, so that the last update is taken at
  the floor rather than one step above it. A run whose warm-up ends at its last step (or a
  one-step run) has no room to decay and stays at `lr`.

The format warm-up (`task.warmup_steps`) has its own rate (`task.warmup_lr`) and is not on this
schedule.
"""

from __future__ import annotations

import math

from core.config import OptimConfig


def lr_at(step: int, optim: OptimConfig, total_steps: int) -> float:
    """The learning rate of RL step `step` (0-based) of a run of `total_steps` steps."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    peak = optim.peak_lr
    warm = optim.lr_warmup_steps
    if step < warm:
        return peak * step / warm
    if optim.schedule == "constant":
        return peak
    span = total_steps - 1 - warm  # steps from the end of the warm-up to the last step
    if span <= 0:
        return peak  # the warm-up ends at the last step: no room left to decay
    progress = min(1.0, (step - warm) / span)
    floor = optim.min_lr_ratio
    if optim.schedule == "linear":
        return peak * (1.0 - (1.0 - floor) * progress)
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))
