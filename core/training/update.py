"""One step's optimizer updates on its rollout batch: GRPO advantages, then epochs x minibatches
AdamW steps, each minibatch's gradient accumulated over micro-batches.

Apart from the recipe (`core.training.run`) because it is the part that the knobs of the update
shape: minibatches and epochs (off-policy updates), gradient accumulation
(`optim.grad_accumulation`) and the KL penalty's reference log-probs (`algorithm.kl_beta`).

How token losses add up is `algorithm.loss_agg` (`loss_normalizer`): `token_mean` (DAPO: every
response token of the rollout batch weighs the same, each of the M minibatches dividing its
token sum by batch tokens / M), `seq_mean` (each sequence's token mean, averaged over the
minibatch's sequences) or `minibatch_token_mean` (each minibatch by its own token count).

Accumulation splits a minibatch of b sequences into pieces of b / accumulation; every piece
divides its token sums by the same normalizer the unsplit minibatch would use (`policy_loss`'s
`normalizer`: a count, or per sequence for `seq_mean`), so the summed gradient is the unsplit
minibatch's, up to fp32 rounding, and gradient clipping and the optimizer step see the same
gradient either way. Where the normalizer is the piece's own token count (one piece, one
minibatch or `minibatch_token_mean`) the loss keeps its own denominator: bit for bit the path
without the knobs.

With top-p sampling the trained policy is the truncated one (`core.objective.truncation`), so that
the ratio and the divergence compare like with like.

With `algorithm.fused_loss` (`fused_loss_applies`) the loss gets the final hidden states and
the output projection instead of the logits (`core.rollout.response_projection`) and never
holds the [tokens x vocabulary] logits (`core.objective.fused`); so do the reference's log-probs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from core.config import LOSS_AGGS, LossAgg, TrainConfig
from core.config.fused import fused_loss_applies as fused_loss_applies  # the estimate's rule too
from core.models.base import CausalLM
from core.objective.lazy_logits import ProjectedLogits
from core.objective.loss import PolicyLossOutput, policy_loss
from core.objective.masks import TrustRegion
from core.objective.truncation import truncate_to_nucleus
from core.parallel.distributed import World
from core.parallel.sharding import full_norm, is_sharded
from core.rollout import RolloutBatch, StopRequested, response_logits, response_projection
from core.training.reference import ReferencePolicy


def group_advantages(rewards: Tensor, group_size: int, normalize_std: bool) -> Tensor:
    """reward - group mean (optionally / group std), rewards (B,) laid out group after group."""
    r = rewards.view(-1, group_size)  # (G, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if normalize_std:
        adv = adv / (r.std(dim=1, keepdim=True) + 1e-6)
    return adv.reshape(-1)


@dataclass
class UpdateSums:
    """What one step's update metrics are made of, piece by piece and minibatch by minibatch:
    each statistic's sum weighted by the tokens it is a mean over, the loss weighted by each
    minibatch's tokens, gradient norms, and the sampler's distance from the policy that first
    trains on each token. `metrics` sums them over the ranks and divides."""

    sums: dict[str, float] = field(default_factory=dict)  # count-weighted, this rank's
    counts: dict[str, float] = field(default_factory=dict)  # the tokens each is over
    loss_sum: float = 0.0
    weight_total: float = 0.0  # response tokens trained on, over every rank
    divergence_max: float = 0.0
    grad_norms: list[float] = field(default_factory=list)
    # |log pi(a) - log mu(a)| of every token, measured by the first pass that trains on it
    # (the first epoch's minibatches partition the batch): how far the sampler was from the
    # policy each token's own update started from
    offpolicy_sum: float = 0.0
    offpolicy_tokens: int = 0

    def add_piece(self, out: PolicyLossOutput, first_epoch: bool) -> None:
        w = float(len(out.log_ratio))
        for k, v in out.stats.items():
            if k != "divergence_max":
                n = out.counts.get(k, w)
                self.sums[k] = self.sums.get(k, 0.0) + n * v
                self.counts[k] = self.counts.get(k, 0.0) + n
        self.divergence_max = max(self.divergence_max, out.stats["divergence_max"])
        if first_epoch:
            self.offpolicy_sum += float(out.log_ratio.abs().sum())
            self.offpolicy_tokens += len(out.log_ratio)

    def add_minibatch(self, loss: float, tokens: float, grad_norm: float) -> None:
        """A minibatch's loss (summed over its pieces) and response tokens, both already
        summed over the ranks."""
        self.grad_norms.append(grad_norm)
        self.weight_total += tokens
        self.loss_sum += tokens * loss

    def metrics(self, world: World) -> dict[str, float]:
        names = sorted(self.sums)  # the same statistics on every rank
        *totals, offpolicy_all, offpolicy_count = world.sums(
            [
                *(self.sums[k] for k in names),
                *(self.counts[k] for k in names),
                self.offpolicy_sum,
                self.offpolicy_tokens,
            ]
        )
        stat_sums, stat_counts = totals[: len(names)], totals[len(names) :]
        metrics = {
            k: v / max(n, 1.0) for k, v, n in zip(names, stat_sums, stat_counts, strict=True)
        }
        metrics["loss"] = self.loss_sum / max(self.weight_total, 1.0)
        metrics["divergence_max"] = world.max(self.divergence_max)
        metrics["grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
        metrics["offpolicy_logratio_abs"] = offpolicy_all / max(offpolicy_count, 1.0)
        return metrics


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
    world: World | None = None,
) -> dict[str, float]:
    """All of one step's updates; returns its metrics, token-weighted means over every piece.

    `should_stop` is asked before every minibatch (True raises `StopRequested`);
    `before_step` is called before every optimizer step (from the first one on, the caller's
    weights hold part of an unfinished step): the run's `core.training.callbacks.Stop`.
    `world`: this rank's place when the batch is this rank's share of a data-parallel step
    (`core.parallel.distributed`); normalizers, gradients and metrics are then the whole
    batch's."""
    world = world or World()
    a = cfg.algorithm
    region = TrustRegion.from_config(a)
    accum = cfg.optim.grad_accumulation
    b = batch.input_ids.shape[0]
    per_mb = b // a.minibatches
    adv_seq = advantages.to(lm.device)  # (B,)
    ref = None  # (B, T) log pi_ref(a), once per step: the reference never changes
    if reference is not None:
        ref = reference.token_logprobs(
            batch,
            cfg.rollout.temperature,
            rows=per_mb // accum,
            top_p=cfg.rollout.top_p,
            fused=fused_loss_applies(cfg),
        )
    sums = UpdateSums()
    params = [p for _, p in lm.trainable()]
    # FSDP reduces the gradients itself, as a mean: see core.parallel.sharding
    sharded = is_sharded(lm)
    scale = float(world.size) if sharded else 1.0
    for epoch in range(a.epochs):
        order = torch.randperm(b, generator=shuffle_gen).to(lm.device)
        for i in range(a.minibatches):
            if should_stop():
                raise StopRequested("stopped between minibatch updates")
            rows = order[i * per_mb : (i + 1) * per_mb].sort().values
            n_mb = int(batch.response_mask[rows].sum())  # the minibatch's response tokens
            norm = loss_normalizer(
                a.loss_agg, batch.response_mask, rows, a.minibatches, accum, world=world
            )
            optimizer.zero_grad(set_to_none=True)
            mb_loss = 0.0
            for piece in rows.chunk(accum):
                out = _piece_loss(lm, batch, piece, cfg, region, adv=adv_seq, ref=ref, norm=norm)
                (out.loss * scale if sharded else out.loss).backward()
                mb_loss += float(out.loss.detach())
                sums.add_piece(out, first_epoch=epoch == 0)
            if not sharded:
                world.sum_grads(params)  # each rank's loss has the global denominator: a sum
            gn = full_norm(torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm))
            before_step()
            optimizer.step()
            mb_loss, n_mb_all = world.sums([mb_loss, float(n_mb)])
            sums.add_minibatch(mb_loss, n_mb_all, float(gn))
    return sums.metrics(world)


def loss_normalizer(
    loss_agg: LossAgg,
    response_mask: Tensor,
    rows: Tensor,
    minibatches: int,
    pieces: int,
    world: World | None = None,
) -> float | Tensor | None:
    """What the pieces of the minibatch `rows` divide their token sums by (`policy_loss`'s
    `normalizer`), for `algorithm.loss_agg`; `response_mask` (B, T) is the whole batch's (with
    a data-parallel `world`, this rank's share of it: the counts are summed over the ranks).

    - `token_mean`: batch tokens / M for every minibatch, so that over a step every response
      token weighs the same (DAPO); a count that is not an integer is fine;
    - `seq_mean`: a (B,) tensor, sequence s's length times the minibatch's sequence count:
      each token of s then weighs 1 / (len_s * b), a mean of per-sequence token means;
    - `minibatch_token_mean`: the minibatch's own token count.

    None where that is the piece's own token count (a minibatch in one piece, and for
    `token_mean` one whose count is batch tokens / M): `policy_loss` then divides by its own
    count, bit for bit the unsplit, single-minibatch path."""
    world = world or World()
    own = pieces == 1 and not world.parallel  # may the piece divide by its own count?
    n_mb = int(response_mask[rows].sum())
    if loss_agg == "seq_mean":
        sequences = world.sum(float(len(rows)))
        return response_mask.sum(-1).float().clamp_min(1.0) * sequences  # (B,)
    if loss_agg == "token_mean":
        share = world.sum(float(response_mask.sum())) / minibatches
        return None if own and share == n_mb else share
    if loss_agg == "minibatch_token_mean":
        return None if own else float(max(world.sum(float(n_mb)), 1.0))
    raise ValueError(f"algorithm.loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")


def _piece_loss(
    lm: CausalLM,
    batch: RolloutBatch,
    rows: Tensor,
    cfg: TrainConfig,
    region: TrustRegion,
    *,
    adv: Tensor,
    ref: Tensor | None,
    norm: float | Tensor | None,
) -> PolicyLossOutput:
    """The loss of the sequences `rows` (sorted) of `batch`, with its gradient graph; `adv`
    (B,) and `ref` (B, T) are the whole batch's, and so is a (B,) `norm`, per sequence
    (`loss_normalizer`)."""
    mb = batch.select(rows)
    keep = mb.response_mask  # (b, T)
    adv_tok = adv[rows][:, None].expand_as(keep)[keep]  # (N,)
    if isinstance(norm, Tensor):
        norm = norm[rows][:, None].expand_as(keep)[keep]  # (N,) per token
    logits: Tensor | ProjectedLogits | None = None
    if fused_loss_applies(cfg):  # hidden states (N, H) and the projection, with grad
        logits = response_projection(lm, mb, cfg.rollout.temperature)
    if logits is None:
        logits = response_logits(lm, mb, cfg.rollout.temperature)  # (N, V) fp32, with grad
        # top-p: the trained policy is the truncated sampler (core.objective.truncation); top_p 1
        # skips it
        logits = truncate_to_nucleus(logits, mb.tokens, cfg.rollout.top_p)
    # each token's row of the piece: the sequence the sequence-level corrections sum over
    seq = torch.arange(keep.shape[0], device=keep.device)[:, None].expand_as(keep)[keep]
    return policy_loss(
        logits=logits,
        tokens=mb.tokens,
        behavior=mb.behavior,
        advantages=adv_tok,
        region=region,
        ref_logprobs=None if ref is None else ref[rows][keep],
        normalizer=norm,
        sequence_ids=seq,
    )
