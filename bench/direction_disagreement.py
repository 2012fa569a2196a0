"""How often the sampled-ratio direction gets the divergence's change wrong, and how well each
estimator of the predicted change agrees with the exact one.

On synthetic LLM-like positions (`core.objective.synthetic`: Zipf-like peaked logits over a V-token
vocabulary; behavior logits = current logits + gap * noise), for each gap it prints:

- ratio vs truth: the fraction of tokens where DPPO's direction rule (sign(A) * sign(pi_a - mu_a))
  disagrees with the true sign of the change of D along the token's step (the `exact` predicted
  change, itself checked against autograd and finite steps in tests/core/test_divergence.py);
- for each estimator, the fraction of tokens whose predicted-change sign agrees with `exact`
  (binary's sign is the ratio rule, so its column is 1 - the first);
- the same agreement restricted to the tokens that matter, those whose exact D exceeds delta;
- the fraction of tokens on which the predictive mask with each estimator makes the same
  keep/mask decision as with `exact`.

    python bench/direction_disagreement.py                   # 2048 positions x 32000 vocab
    python bench/direction_disagreement.py --kind kl --delta 0.05
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from core import TrustRegion, predicted_change, trust_region_mask
from core.objective.estimators import KINDS, divergence
from core.objective.synthetic import positions, topk_view

ESTIMATORS = [("binary", 20), ("topk", 5), ("topk", 20), ("topk", 50), ("topk_tail", 20)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--kind", choices=KINDS, default="tv")
    parser.add_argument("--delta", type=float, default=0.15, help="proximity threshold")
    parser.add_argument("--peak", type=float, default=1.0, help="sharpness of the logits")
    parser.add_argument("--gaps", default="0.05,0.1,0.2,0.5,1.0,2.0")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    gaps = [float(g) for g in args.gaps.split(",")]
    names = [f"{e}" if e in ("binary",) else f"{e}@{k}" for e, k in ESTIMATORS]

    print(
        f"{args.tokens} positions x {args.vocab} vocab, kind={args.kind}, delta={args.delta}, "
        f"peak={args.peak}, seed={args.seed}"
    )
    header = f"{'gap':>5} {'D mean':>7} {'D>delta':>7} {'H(pi)':>6} {'ratio vs truth':>14}"
    print("sign agreement of the predicted change with exact: all tokens | tokens with D > delta")
    print(header + "".join(f" {n:>17}" for n in names))
    decisions: list[str] = []
    for gap in gaps:
        p = positions(args.tokens, args.vocab, k=50, gap=gap, peak=args.peak, seed=args.seed)
        assert p.behavior.full_logprobs is not None
        exact_g = predicted_change(
            p.logits, p.behavior, p.tokens, p.advantages, kind=args.kind, estimator="exact"
        )
        d = divergence(p.logits, p.behavior, p.tokens, kind=args.kind, estimator="exact")
        far = d > args.delta
        logp = torch.log_softmax(p.logits, dim=-1)
        entropy = float(-(logp.exp() * logp).sum(-1).mean())
        del logp
        ratio_dir = torch.sign(p.advantages) * torch.sign(
            p.logits.gather(-1, p.tokens[:, None]).squeeze(-1)
            - torch.logsumexp(p.logits, dim=-1)
            - p.behavior.token_logprobs
        )
        truth = torch.sign(exact_g)
        ratio_wrong = float((ratio_dir != truth).float().mean())
        row = (
            f"{gap:5.2f} {float(d.mean()):7.3f} {float(far.float().mean()):7.3f} "
            f"{entropy:6.2f} {ratio_wrong:14.3f}"
        )
        exact = TrustRegion(
            mask="predictive",
            kind=args.kind,
            estimator="exact",
            delta_low=args.delta,
            delta_high=args.delta,
        )
        keep_exact = trust_region_mask(p.logits, p.behavior, p.tokens, p.advantages, exact)
        same_decision = []
        for estimator, k in ESTIMATORS:
            view = topk_view(p.behavior.full_logprobs, p.tokens, k, keep_full=False)
            g = predicted_change(
                p.logits, view, p.tokens, p.advantages, kind=args.kind, estimator=estimator
            )
            agree = torch.sign(g) == truth
            agree_far = float(agree[far].float().mean()) if far.any() else float("nan")
            row += f" {float(agree.float().mean()):8.3f} |{agree_far:6.3f}"
            region = replace(exact, estimator=estimator)
            keep = trust_region_mask(p.logits, view, p.tokens, p.advantages, region)
            same_decision.append(float((keep == keep_exact).float().mean()))
        print(row)
        masked_exact = float((~keep_exact).float().mean())
        decisions.append(
            f"{gap:5.2f} {masked_exact:13.3f}" + "".join(f" {s:17.3f}" for s in same_decision)
        )
    print("\nsame keep/mask decision as the predictive mask with exact")
    print(f"{'gap':>5} {'masked(exact)':>13}" + "".join(f" {n:>17}" for n in names))
    print("\n".join(decisions))


if __name__ == "__main__":
    main()
