"""The training objective: what one update minimizes, and every quantity it is built from.

`behavior`: the behavior policy's view of a sampled token (its log-prob and top-K row);
`divergence`: divergences between that view and the current policy, and their estimators
(`row_sums`: the per-chunk sums of its statistics pass);
`masks`: the trust-region masks (the predictive rule, DPPO's); `loss`: the policy loss under a
mask; `fused` and `lazy_logits`: the same loss from hidden states and the output projection,
one vocabulary chunk at a time; `truncation`: top-p truncation of the behavior distribution;
`synthetic`: LLM-like positions for its tests and benchmarks.

Imports: torch, and nothing else from `core` (every other package may build on it).
"""
