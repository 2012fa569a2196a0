"""Greedy decoding the slow, obvious way, which `generate` is held to."""

from __future__ import annotations

from typing import Any

import torch


def argmax_decode(lm: Any, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding the slow, obvious way, for tests to hold `generate` to: each prompt
    alone, without padding or the KV cache, the whole sequence run again for every token."""
    out: list[list[int]] = []
    with torch.no_grad():
        for ids in prompts:
            new: list[int] = []
            for _ in range(max_new_tokens):
                seq = torch.tensor([ids + new])
                mask = torch.ones_like(seq, dtype=torch.bool)
                logits, _ = lm.forward(seq, mask, torch.arange(seq.shape[1])[None], keep_last=1)
                nxt = int(logits[0, -1].argmax())
                if nxt == lm.tokenizer.eos_id:
                    break
                new.append(nxt)
            out.append(new)
    return out
