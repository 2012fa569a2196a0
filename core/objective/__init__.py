"""The training objective: what one update minimizes, and every quantity it is built from.

`behavior`: the behavior policy's view of a sampled token (its log-prob and top-K row);
`estimators`: divergences between that view and the current policy and their predicted change,
by estimator (`row_sums`, `full_vocab`: the chunked passes behind them);
`masks`: `TrustRegion`, how the loss treats off-policy tokens (mask, divergence, thresholds, IS
cap, KL weight), and the masks (the predictive rule, DPPO's); `loss`: the policy loss under a
trust region, from the logits or (`fused_policy_loss`) from hidden states and the output
projection; `fused` and `lazy_logits`: the latter's passes, one vocabulary chunk at a time;
`truncation`: top-p truncation of the behavior distribution; `synthetic`: LLM-like positions
for its tests and benchmarks.

Imports: torch, and nothing else from `core` (every other package may build on it).
"""
