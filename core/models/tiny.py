"""`builtin:tiny`: a small causal transformer and a byte tokenizer, made locally (no download).

The vocabulary has 512 entries (4 specials, 256 bytes, 252 reserved) so that a top-20 view of the
behavior policy is a real truncation, as with production vocabularies, while the model stays
small enough to learn a task on a laptop CPU in minutes. `model.tiny.vocab_size` pads the
embedding and the output layer with more ids (an LLM-sized vocabulary for the loss's memory
benchmarks, bench/loss_memory.py): the tokenizer never encodes them nor decodes them, like its
reserved ids; the model may sample them, and is trained away from them, like those.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model
from torch import Tensor, nn

from core.config import TinyModelConfig
from core.models.base import CausalLM

VOCAB_SIZE = 512
PAD, BOS, EOS, UNK = 0, 1, 2, 3
_BYTE0 = 4

KVCache = list[tuple[Tensor, Tensor]]
"""Keys and values (B, H, T, Dh) per block: a prefill's, or a training forward's prompt part."""


class KVBuffer:
    """Keys and values of every block in preallocated (B, H, capacity, Dh) tensors, for decoding.

    Each generated token writes one column per block in place, where a `KVCache` would be
    re-copied whole by `torch.cat` (a cost that grows with the sequence, per token and block).
    `length` counts the columns written; a forward writes its tokens at `length` in every block
    and then `advance`s. Decoding only (no autograd through the in-place writes)."""

    def __init__(self, prefill: KVCache, rows: Tensor, room: int) -> None:
        """The prefill's cache of distinct prompts, row `rows[i]` of it as row i (int64
        indices), with `room` free columns."""
        self.length = prefill[0][0].shape[2]
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        for k, v in prefill:
            for src, dst in ((k, self.keys), (v, self.values)):
                buf = src.new_empty(len(rows), src.shape[1], self.length + room, src.shape[3])
                buf[:, :, : self.length] = src[rows]
                dst.append(buf)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def write(self, block: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store a forward's new columns of `block`; all its keys and values so far (views)."""
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KV buffer of {self.capacity} columns cannot take column {end}")
        self.keys[block][:, :, self.length : end] = k
        self.values[block][:, :, self.length : end] = v
        return self.keys[block][:, :, :end], self.values[block][:, :, :end]

    def advance(self, t: int) -> None:
        self.length += t

    def select(self, rows: Tensor) -> KVBuffer:
        """Keep rows `rows` only (finished rows leave decoding): one copy of the buffers."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        return self


class ByteTokenizer:
    """UTF-8 bytes shifted past four special ids; ids 260..511 are reserved and never encoded."""

    vocab_size = VOCAB_SIZE
    eos_id = EOS
    pad_id = PAD
    bos_id = BOS

    def encode(self, text: str) -> list[int]:
        return [b + _BYTE0 for b in text.encode("utf-8")]

    def encode_prompt(self, text: str) -> list[int]:
        return [BOS, *self.encode(text)]

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """A plain-text chat layout, `role: content` per line then `assistant: `: the built-in
        model has no chat template, and bytes need none to learn one."""
        lines = [f"{m['role']}: {m['content']}\n" for m in messages]
        return self.encode_prompt("".join(lines) + "assistant: ")

    def decode(self, ids: list[int]) -> str:
        data = bytes(i - _BYTE0 for i in ids if _BYTE0 <= i < _BYTE0 + 256)
        return data.decode("utf-8", errors="replace")


class _Block(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        past: tuple[Tensor, Tensor] | None,
        buffer: KVBuffer | None = None,
        index: int = 0,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """`past`: this block's cached keys and values, concatenated in front of the new ones
        (with autograd); or `buffer`, a decoding buffer this block (number `index`) writes to."""
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))  # (B, H, T, Dh)
        if buffer is not None:
            k, v = buffer.write(index, k, v)
        elif past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # mask (B, 1, T, Tk)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.ln2(x))
        return x, (k, v)


class TinyTransformer(nn.Module):
    """Pre-LayerNorm GPT with learned positions; no dropout, so pi and mu differ only by design."""

    def __init__(self, cfg: TinyModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        vocab_size = cfg.vocab_size  # past the byte tokenizer's: padding rows (TinyModelConfig)
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg.d_model, cfg.n_heads) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))

    def forward(
        self,
        input_ids: Tensor,  # (B, T)
        attention_mask: Tensor,  # (B, Tk) with Tk = T_past + T
        position_ids: Tensor,  # (B, T)
        cache: KVCache | KVBuffer | None = None,
        keep_last: int | None = None,
        use_cache: bool = True,
        hidden_only: bool = False,
    ) -> tuple[Tensor, KVCache | KVBuffer | None]:
        """Logits and the cache: a `KVCache` of all keys so far, or the given `KVBuffer`
        advanced past these tokens; None with `use_cache=False` (a training forward).
        `hidden_only`: the final hidden states in place of the logits (the fused loss)."""
        t = input_ids.shape[1]
        tk = attention_mask.shape[1]
        # positions come from the mask (at most tk - 1): reading them back, a host sync on a
        # GPU, is only needed when the keys outgrow the table
        if tk > self.cfg.max_seq_len and int(position_ids.max()) >= self.cfg.max_seq_len:
            raise ValueError(
                f"sequence of {int(position_ids.max()) + 1} tokens exceeds "
                f"model.tiny.max_seq_len={self.cfg.max_seq_len}"
            )
        x = self.tok(input_ids) + self.pos(position_ids)
        # query i sits at key position tk - t + i; it sees real keys at or before it, and itself
        # (so that left-padding queries never attend to nothing and produce NaN).
        qpos = torch.arange(tk - t, tk, device=x.device)[:, None]
        kpos = torch.arange(tk, device=x.device)[None, :]
        causal = kpos <= qpos  # (T, Tk)
        keys = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, Tk)
        mask = (causal[None, None] & keys) | (kpos == qpos)[None, None]  # (B, 1, T, Tk)
        new_cache: KVCache = []
        buffer = cache if isinstance(cache, KVBuffer) else None
        layers = cache if isinstance(cache, list) else None
        for i, block in enumerate(self.blocks):
            x, kv = block(x, mask, None if layers is None else layers[i], buffer, i)
            new_cache.append(kv)
        if keep_last is not None:
            x = x[:, -keep_last:]
        x = self.ln_f(x)
        logits = x if hidden_only else self.head(x)
        if isinstance(cache, KVBuffer):
            cache.advance(t)
            return logits, cache
        return logits, new_cache if use_cache else None


class TinyLM(CausalLM):
    def __init__(self, cfg: TinyModelConfig) -> None:
        self.cfg = cfg
        self.module = TinyTransformer(cfg)
        self.tokenizer = ByteTokenizer()
        self.max_seq_len = cfg.max_seq_len

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: Any = None,
        keep_last: int | None = None,
        use_cache: bool = True,
    ) -> tuple[Tensor, Any]:
        logits, new_cache = self.module(
            input_ids, attention_mask, position_ids, cache, keep_last=keep_last, use_cache=use_cache
        )
        return logits, new_cache

    def forward_hidden(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: Any = None,
        keep_last: int | None = None,
        use_cache: bool = True,
    ) -> tuple[Tensor, Any]:
        hidden, new_cache = self.module(
            input_ids,
            attention_mask,
            position_ids,
            cache,
            keep_last=keep_last,
            use_cache=use_cache,
            hidden_only=True,
        )
        return hidden, new_cache

    def output_projection(self) -> tuple[Tensor, Tensor | None]:
        assert isinstance(self.module, TinyTransformer)
        return self.module.head.weight, None

    @property
    def shares_prefix(self) -> bool:
        return True

    def expand_cache(self, cache: Any, rows: Tensor, room: int = 0) -> Any:
        if room == 0:
            return [(k[rows], v[rows]) for k, v in cache]
        return KVBuffer(cache, rows, room)

    def select_cache(self, cache: Any, rows: Tensor) -> Any:
        if not isinstance(cache, KVBuffer):
            raise TypeError(f"select_cache takes a decoding KVBuffer, got {type(cache).__name__}")
        return cache.select(rows)

    def save_final(self, path: Path, *, merged: bool = True) -> None:
        """pdppo's own format (no adapters: `merged` has nothing to do), with a README.md: the
        folder looks like a Hugging Face one (config.json, model.safetensors), and
        `from_pretrained` on it says only that config.json lacks a `model_type`."""
        path.mkdir(parents=True, exist_ok=True)
        save_model(self.module, str(path / "model.safetensors"))
        cfg = self.cfg.model_dump()
        meta = {"model": "builtin:tiny", "tiny": cfg, "vocab_size": self.cfg.vocab_size}
        (path / "config.json").write_text(json.dumps(meta, indent=2))
        (path / "README.md").write_text(TINY_README)

    def save_final_state(self, path: Path, state: dict[str, Tensor]) -> None:
        whole = TinyLM(self.cfg)  # on the CPU, where `state` is
        whole.module.load_state_dict(state)
        whole.save_final(path)

    def blocks(self) -> list[nn.Module]:
        assert isinstance(self.module, TinyTransformer)
        return list(self.module.blocks)


TINY_README = """\
# A pdppo `builtin:tiny` model: not a Hugging Face model

This folder holds pdppo's built-in toy transformer (`model.name: builtin:tiny`), trained from
scratch with its byte tokenizer. It is not a Hugging Face model: `transformers`
(`AutoModelForCausalLM.from_pretrained`), PEFT and vLLM cannot load it (transformers answers
"Unrecognized model ... Should have a `model_type` key in its config.json").

Load it with pdppo (`pip install pdppo`):

    from pathlib import Path
    from core.models.tiny import load_tiny_final

    lm = load_tiny_final(Path("final"))  # lm.module: a torch.nn.Module; lm.tokenizer: bytes

or start a later job from it with `model.name: job:<this job's id>`. A job on an `hf:` model
writes a standard Hugging Face folder instead (docs/users/using-the-model.md).
"""


def load_tiny_final(path: Path) -> TinyLM:
    """Rebuild a `builtin:tiny` model saved by `save_final`."""
    meta = json.loads((path / "config.json").read_text())
    lm = TinyLM(TinyModelConfig(**meta["tiny"]))
    load_model(lm.module, str(path / "model.safetensors"))
    return lm
