"""The pdppo trainer as a plain torch library: trust-region masks, estimators, loss, training.

Imports no web or queue code; `api/` and `workers/` build on it. Without torch (the client
install, `pip install pdppo`), importing `core` still works and so do its torch-free modules
(`core.config`, `core.budget`: `pdppo submit --dry-run` prints `core.budget`'s report); the names
below then say which extra brings torch. The names are `core.objective`'s (`core.extras` names
the missing extra).

Its packages, bottom up (each one's docstring says what it may import; tests/deploy/test_layout.py
holds them to it and fails on any import circle):

- `config` (the typed job config), `disk` (files on disk), `process` (this OS process),
  `objective` (the behavior view, divergences, trust-region masks, the loss and its fused form):
  nothing else from `core`;
- `graders`, `tasks`, `models`, `budget`: on `config` and `disk`, and on each other in that order;
- `parallel` (ranks, sharding), then `rollout` (sampling: the built-in engine, prefix sharing,
  vLLM);
- `training` (the loop: run, update, warm-up, reference, evaluation, checkpoints, schedule,
  steering), on all of the above.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from core.extras import MissingExtra

__all__ = [
    "BehaviorView",
    "MaskDecision",
    "PolicyLossOutput",
    "TrustRegion",
    "divergence",
    "fused_policy_loss",
    "policy_loss",
    "predicted_change",
    "trust_region",
    "trust_region_mask",
]

# Lazy: the API and the CLI import `core.config`, `core.budget` and friends, and an eager import
# of these names would load torch (about 2 s of CPU) into every `pdppo` process, the API server's
# and each `pdppo status` included, which never use it.
_WHERE = {
    "BehaviorView": "core.objective.behavior",
    "MaskDecision": "core.objective.masks",
    "PolicyLossOutput": "core.objective.loss",
    "TrustRegion": "core.objective.masks",
    "divergence": "core.objective.estimators",
    "fused_policy_loss": "core.objective.loss",
    "policy_loss": "core.objective.loss",
    "predicted_change": "core.objective.estimators",
    "trust_region": "core.objective.masks",
    "trust_region_mask": "core.objective.masks",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'core' has no attribute {name!r}")
    if importlib.util.find_spec("torch") is None:
        raise MissingExtra(f"core.{name}", "worker", "torch")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from core.objective.behavior import BehaviorView
    from core.objective.estimators import divergence, predicted_change
    from core.objective.loss import PolicyLossOutput, fused_policy_loss, policy_loss
    from core.objective.masks import MaskDecision, TrustRegion, trust_region, trust_region_mask
