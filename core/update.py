"""One step's optimizer updates on its rollout batch: GRPO advantages, then epochs x minibatches
AdamW steps, each minibatch's gradient accumulated over micro-batches.

Apart from the loop (`core.trainer`) because it is the part that the knobs of the update shape:
minibatches and epochs (off-policy updates), gradient accumulation (`optim.grad_accumulation`)
and the KL penalty's reference log-probs (`algorithm.kl_beta`).

Accumulation splits a minibatch of b sequences into pieces of b / accumulation; every piece
divides its token sums by the whole minibatch's response-token count (`policy_loss`'s
`normalizer`), so the summed gradient is the unsplit minibatch's, up to fp32 rounding, and
gradient clipping and the optimizer step see the same gradient either way. With accumulation 1
the loss keeps its own denominator: bit for bit the path without the knob.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from core.config import TrainConfig
from core.loss import PolicyLossOutput, policy_loss
from core.models.base import CausalLM
from core.reference import ReferencePolicy
from core.rollout import RolloutBatch, StopRequested, response_logits


def group_advantages(rewards: Tensor, group_size: int, normalize_std: bool) -> Tensor:
    """reward - group mean (optionally / group std), rewards (B,) laid out group after group."""
    r = rewards.view(-1, group_size)  # (G, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if normalize_std:
        adv = adv / (r.std(dim=1, keepdim=True) + 1e-6)
    return adv.reshape(-1)


def update_policy(
    lm: CausalLM,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    advantages: Tensor,
    cfg: TrainConfig,
    *,
    shuffle_gen: torch.Generator,
    reference: ReferencePolicy | None,
    should_stop: Callable[[], bool],
    before_step: Callable[[], None],
) -> dict[str, float]:
    """All of one step's updates; returns its metrics, token-weighted means over every piece.

    `should_stop` is asked before every minibatch (True raises `StopRequested`);
    `before_step` is called before every optimizer step (from the first one on, the caller's
    weights hold part of an unfinished step)."""
    a = cfg.algorithm
    accum = cfg.optim.grad_accumulation
    b = batch.input_ids.shape[0]
    per_mb = b // a.minibatches
    adv_seq = advantages.to(lm.device)  # (B,)
    ref = None  # (B, T) log pi_ref(a), once per step: the reference never changes
    if reference is not None:
        ref = reference.token_logprobs(batch, cfg.rollout.temperature, rows=per_mb // accum)
    sums: dict[str, float] = {"loss": 0.0}
    weight_total = 0.0
    div_max = 0.0
    grad_norms: list[float] = []
    offpolicy = float("nan")
    params = [p for _, p in lm.trainable()]
    for _epoch in range(a.epochs):
        order = torch.randperm(b, generator=shuffle_gen).to(lm.device)
        for i in range(a.minibatches):
            if should_stop():
                raise StopRequested("stopped between minibatch updates")
            rows = order[i * per_mb : (i + 1) * per_mb].sort().values
            n_mb = int(batch.response_mask[rows].sum())  # the minibatch's response tokens
            norm = None if accum == 1 else float(max(n_mb, 1))
            optimizer.zero_grad(set_to_none=True)
            mb_loss = 0.0
            first_ratios: list[Tensor] = []
            for piece in rows.chunk(accum):
                out = _piece_loss(lm, batch, piece, adv_seq, ref, norm, cfg)
                out.loss.backward()
                mb_loss += float(out.loss.detach())
                w = float(len(out.log_ratio))
                for k, v in out.stats.items():
                    if k != "divergence_max":
                        sums[k] = sums.get(k, 0.0) + w * v
                div_max = max(div_max, out.stats["divergence_max"])
                if math.isnan(offpolicy):
                    first_ratios.append(out.log_ratio.abs())
            if math.isnan(offpolicy):
                # how far the sampler was from the trained policy before any update on it
                offpolicy = float(torch.cat(first_ratios).mean())
            gn = torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm)
            before_step()
            optimizer.step()
            grad_norms.append(float(gn))
            weight_total += float(n_mb)
            sums["loss"] += float(n_mb) * mb_loss
    metrics = {k: v / max(weight_total, 1.0) for k, v in sums.items()}
    metrics["divergence_max"] = div_max
    metrics["grad_norm"] = sum(grad_norms) / len(grad_norms)
    metrics["offpolicy_logratio_abs"] = offpolicy
    return metrics


def _piece_loss(
    lm: CausalLM,
    batch: RolloutBatch,
    rows: Tensor,
    adv_seq: Tensor,
    ref: Tensor | None,
    normalizer: float | None,
    cfg: TrainConfig,
) -> PolicyLossOutput:
    """The loss of the sequences `rows` (sorted) of `batch`, with its gradient graph."""
    a = cfg.algorithm
    mb = batch.select(rows)
    keep = mb.response_mask  # (b, T)
    adv_tok = adv_seq[rows][:, None].expand_as(keep)[keep]  # (N,)
    logits = response_logits(lm, mb, cfg.rollout.temperature)  # (N, V) fp32, with grad
    return policy_loss(
        logits=logits,
        tokens=mb.tokens,
        behavior=mb.behavior,
        advantages=adv_tok,
        mask=a.mask,
        kind=a.kind,
        estimator=a.estimator,
        delta_low=a.delta_low,
        delta_high=a.delta_high,
        is_cap=a.is_cap,
        ref_logprobs=None if ref is None else ref[rows][keep],
        kl_beta=a.kl_beta,
        normalizer=normalizer,
    )
