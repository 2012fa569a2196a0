"""What the rollout engine exposed about its sampling distribution, per generated token.

Production engines (vLLM `SamplingParams(logprobs=K)`, SGLang `top_logprobs_num=K`) return only
the top-K log-probs plus the sampled token's. The trainer has the full current policy, so every
estimator in `core.objective.estimators` works from this truncated view of the behavior policy `mu`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class BehaviorView:
    """The behavior policy as seen by the trainer, for N generated tokens.

    `topk_ids` must contain the sampled token in each row (engines replace the K-th entry by it
    when it is missing); `core.objective.estimators` still copes when it does not. Log-probs may be
    -inf for tokens the engine could not sample (top-p): every estimator floors them.
    """

    token_logprobs: Tensor  # (N,) log mu(a) of the sampled token
    topk_ids: Tensor  # (N, K) int64
    topk_logprobs: Tensor  # (N, K) log mu of those ids
    full_logprobs: Tensor | None = None  # (N, V) only for the `exact` estimator

    def __post_init__(self) -> None:
        n = self.token_logprobs.shape[0]
        if self.token_logprobs.dim() != 1:
            raise ValueError(f"token_logprobs must be (N,), got {tuple(self.token_logprobs.shape)}")
        if self.topk_ids.dim() != 2 or self.topk_ids.shape[0] != n:
            raise ValueError(f"topk_ids must be (N={n}, K), got {tuple(self.topk_ids.shape)}")
        if self.topk_logprobs.shape != self.topk_ids.shape:
            raise ValueError(
                f"topk_logprobs {tuple(self.topk_logprobs.shape)} must match "
                f"topk_ids {tuple(self.topk_ids.shape)}"
            )
        if self.topk_ids.dtype != torch.long:
            raise ValueError(f"topk_ids must be int64, got {self.topk_ids.dtype}")
        if self.full_logprobs is not None and (
            self.full_logprobs.dim() != 2 or self.full_logprobs.shape[0] != n
        ):
            raise ValueError(
                f"full_logprobs must be (N={n}, V), got {tuple(self.full_logprobs.shape)}"
            )

    def __len__(self) -> int:
        return int(self.token_logprobs.shape[0])

    @property
    def k(self) -> int:
        return int(self.topk_ids.shape[1])

    def select(self, index: Tensor) -> BehaviorView:
        """Rows `index` (a bool mask or int64 indices over N): for minibatches and masking."""
        full = None if self.full_logprobs is None else self.full_logprobs[index]
        return BehaviorView(
            self.token_logprobs[index], self.topk_ids[index], self.topk_logprobs[index], full
        )

    def to(self, device: torch.device | str) -> BehaviorView:
        full = None if self.full_logprobs is None else self.full_logprobs.to(device)
        return BehaviorView(
            self.token_logprobs.to(device),
            self.topk_ids.to(device),
            self.topk_logprobs.to(device),
            full,
        )
