"""Logits that are never held whole: what the fused loss (`core.objective.fused`) passes around
instead of a (N, V) tensor.

At LLM vocabularies (128k-152k) the fp32 logits of one minibatch are gigabytes, yet the loss
reads them through a few numbers per row. Two stand-ins make that explicit:

- `ProjectedLogits`: the logits as `(hidden @ weight.T + bias) / temperature`, what a model's
  output projection would produce; `core.objective.loss.policy_loss` given one takes the fused path.
- `GatheredLogits`: the logits at a few columns per row (the behavior view's ids and the
  sampled token), all that the `binary` and `topk` estimators read of them once the
  full-vocabulary sums are in a `SoftmaxStats`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ProjectedLogits:
    """Logits (N, V) = (hidden @ weight.T + bias) / temperature, computed in fp32 whatever the
    dtype of `hidden` (N, H), `weight` (V, H) and `bias` (V,) (a bf16 model's)."""

    hidden: Tensor
    weight: Tensor
    bias: Tensor | None = None
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.hidden.dim() != 2 or self.weight.dim() != 2:
            raise ValueError(
                f"hidden must be (N, H) and weight (V, H), got {tuple(self.hidden.shape)} "
                f"and {tuple(self.weight.shape)}"
            )
        if self.hidden.shape[1] != self.weight.shape[1]:
            raise ValueError(
                f"hidden {tuple(self.hidden.shape)} and weight {tuple(self.weight.shape)} "
                "must share their last dimension H"
            )
        if self.bias is not None and self.bias.shape != (self.weight.shape[0],):
            raise ValueError(
                f"bias must be (V={self.weight.shape[0]},), got {tuple(self.bias.shape)}"
            )
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.hidden.shape[0], self.weight.shape[0]))

    def materialize(self) -> Tensor:
        """The (N, V) fp32 logits themselves, with autograd: the unfused reference."""
        z = self.hidden.float() @ self.weight.float().T
        if self.bias is not None:
            z = z + self.bias.float()
        return z / self.temperature if self.temperature != 1.0 else z


@dataclass(frozen=True)
class GatheredLogits:
    """fp32 logits of a (N, V) matrix at the columns `ids` (N, S), which may repeat."""

    ids: Tensor  # (N, S) int64
    values: Tensor  # (N, S) fp32
    vocab: int  # V

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.ids.shape[0], self.vocab))

    def at(self, query: Tensor) -> Tensor:
        """(N, Q) the logits at the columns `query` (N, Q); each must be one of the row's ids."""
        match = query.unsqueeze(-1) == self.ids.unsqueeze(-2)  # (N, Q, S)
        if not bool(match.any(-1).all()):
            raise KeyError("GatheredLogits: a queried column was not gathered")
        where = match.to(torch.uint8).argmax(-1)  # (N, Q): the first matching column
        return self.values.gather(-1, where)
