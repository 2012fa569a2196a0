"""The pdppo trainer as a plain torch library: trust-region masks, estimators, loss, training.

Imports no web or queue code; `api/` and `workers/` build on it.
"""

from core.behavior import BehaviorView
from core.divergence import divergence, predicted_change
from core.fused import fused_policy_loss
from core.loss import PolicyLossOutput, policy_loss
from core.masks import trust_region, trust_region_mask

__all__ = [
    "BehaviorView",
    "PolicyLossOutput",
    "divergence",
    "fused_policy_loss",
    "policy_loss",
    "predicted_change",
    "trust_region",
    "trust_region_mask",
]
