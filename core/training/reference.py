"""The reference policy of the KL penalty (`algorithm.kl_beta`): the model as it was loaded.

The penalty (`core.objective.loss`) needs `log pi_ref(a)` of every sampled token. The reference is
the policy before any update of this run, format warm-up included, so that it is the same whether
the run is fresh or resumed from a checkpoint (a resumed run rebuilds it by loading the model again;
nothing of it is checkpointed):

- with LoRA, the base model with its adapters disabled: no copy, the base weights never train;
- otherwise a frozen copy of the weights, in the training dtype, made before the first update.

With top-p sampling the reference is truncated like the trained policy
(`core.objective.truncation`): its own nucleus plus the sampled token, so that the penalty is
exactly 0 before the first update.

The reference's log-probs are computed once per step, for the whole rollout batch, under
no_grad and in chunks of one micro-batch (its forward pass costs no more memory than the
update's); the reference never changes, so the epochs and minibatches of a step share them.
Where the policy's loss is fused (`core.training.update.fused_loss_applies`) they come from the
hidden states and the output projection in vocabulary chunks too (`core.objective.fused`), by the
same arithmetic as the policy's log pi(a).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from core.models.base import CausalLM
from core.objective.fused import projected_token_logprobs
from core.objective.truncation import truncate_to_nucleus
from core.rollout import RolloutBatch, response_logits, response_projection


class ReferencePolicy:
    """Log-probs of sampled tokens under the initial policy (see the module docstring)."""

    def __init__(self, lm: CausalLM) -> None:
        """Build it from the freshly loaded policy `lm`, before any update."""
        self.lm: CausalLM
        self._context: Callable[[], contextlib.AbstractContextManager[Any]]
        if lm.has_adapters:
            self.lm, self._context = lm, lm.adapters_disabled
        else:
            self.lm, self._context = lm.copy_as(lm.dtype), contextlib.nullcontext
        self.shares_weights = lm.has_adapters  # False: `lm` is a copy of its own

    @torch.no_grad()
    def token_logprobs(
        self,
        batch: RolloutBatch,
        temperature: float,
        rows: int,
        top_p: float = 1.0,
        *,
        fused: bool = False,
    ) -> Tensor:
        """(B, T) fp32 `log pi_ref(a)` at every response token (0 elsewhere), at the sampling
        temperature and under the sampler's top-p truncation (`core.objective.truncation`) like the
        trained policy's log-probs, `rows` sequences per forward pass. `fused`: as the fused
        loss computes log pi(a), without the logits (where the model allows it)."""
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        mask = batch.response_mask  # (B, T)
        out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        for start in range(0, mask.shape[0], rows):
            idx = torch.arange(start, min(start + rows, mask.shape[0]), device=mask.device)
            part = batch.select(idx)
            with self._context():
                proj = response_projection(self.lm, part, temperature) if fused else None
                if proj is not None:  # the fused loss's own log pi(a) (core.objective.fused)
                    logp = projected_token_logprobs(proj, part.tokens)
                else:
                    logits = response_logits(self.lm, part, temperature)  # (N_part, V) fp32
            if proj is None:
                logits = truncate_to_nucleus(logits, part.tokens, top_p)
                # the same expression as the policy's log pi(a) in core.objective.loss: equal
                # weights, equal values, so the penalty is exactly 0 before the first update
                logp = -F.cross_entropy(logits, part.tokens, reduction="none")
            out[idx[0] : idx[-1] + 1][part.response_mask] = logp
        return out
