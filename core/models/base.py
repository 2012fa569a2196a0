"""What the trainer needs from a language model, whatever its origin (built-in or Hugging Face).

One small interface so that the rollout engine, the loss and checkpoints never branch on the model
family: a forward pass with an optional KV cache over left-padded batches, a tokenizer with EOS and
pad ids, the trainable parameters, and saving in the family's own format.

The `group_size` completions of a prompt share it: a model whose cache can be indexed by row
(`shares_prefix`) runs each distinct prompt once and gives its keys and values to every row of
its group (`expand_cache`), in generation and in the training forward (`core.rollout.prefix`);
decoding drops finished rows from its cache (`select_cache`). Other models run every row in full.
"""

from __future__ import annotations

import abc
import contextlib
import copy
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from core.tasks.base import Example


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int
    pad_id: int

    def encode_prompt(self, text: str) -> list[int]:
        """Prompt ids, with whatever start token the model was trained with."""
        ...

    def encode(self, text: str) -> list[int]:
        """Plain ids, no special tokens (completions in the warm-up)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of ids, special tokens dropped."""
        ...

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Prompt ids of chat turns, ending where the assistant's reply begins (the model's
        chat template with add_generation_prompt=True)."""
        ...


def renders_chat(tok: Tokenizer, example: Example) -> bool:
    """Whether `example` is encoded as chat turns: it has some, and either needs them or the
    model has a chat template (`Example.chat_optional`; builtin:tiny has none)."""
    if example.messages is None:
        return False
    return not example.chat_optional or bool(getattr(tok, "has_chat_template", False))


def encode_example(tok: Tokenizer, example: Example) -> list[int]:
    """The prompt ids of a task example: its chat turns when it is rendered as chat
    (`renders_chat`), else its text."""
    if example.messages is not None and renders_chat(tok, example):
        return tok.encode_chat(example.messages)
    return tok.encode_prompt(example.prompt)


def check_chat_prompts(tok: Tokenizer, examples: Iterable[Example]) -> None:
    """Renders the first example that is rendered as chat, so that a model which cannot (no chat
    template, or one that refuses these turns) fails when the run is set up, with the
    template's own message, instead of after the warm-up at the first step that draws one."""
    first = next((e for e in examples if renders_chat(tok, e)), None)
    if first is not None and first.messages is not None:
        tok.encode_chat(first.messages)


class CausalLM(abc.ABC):
    """A causal LM plus its tokenizer, driven with explicit masks and position ids."""

    module: nn.Module
    tokenizer: Tokenizer
    max_seq_len: int | None = None

    @abc.abstractmethod
    def forward(
        self,
        input_ids: Tensor,  # (B, T) int64
        attention_mask: Tensor,  # (B, T_past + T) bool/int, 1 = real token
        position_ids: Tensor,  # (B, T) int64
        cache: Any = None,
        keep_last: int | None = None,
        use_cache: bool = True,
    ) -> tuple[Tensor, Any]:
        """Logits (B, T, V) in the module's dtype and the updated cache.

        `keep_last=n` computes logits for the last n positions only: with a large vocabulary the
        (B, T, V) logits of the prompt would dominate memory for nothing. `use_cache=False`
        builds no cache (None is returned): a training forward over whole sequences needs none.
        """

    def forward_hidden(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: Any = None,
        keep_last: int | None = None,
        use_cache: bool = True,
    ) -> tuple[Tensor, Any]:
        """`forward` stopped before the output layer: the final hidden states (B, T, H) in the
        module's dtype, and the cache. Only where `output_projection` is not None."""
        raise TypeError(f"{type(self).__name__} does not expose its final hidden states")

    def output_projection(self) -> tuple[Tensor, Tensor | None] | None:
        """(weight (V, H), bias (V,) or None), the output layer's own parameters (a tied
        embedding's, a frozen one under LoRA), when `forward`'s logits are exactly
        `forward_hidden`'s states times them plus the bias: all the fused loss
        (`core.objective.fused`) needs to never form the logits. None (the default) where they are
        not (scaled or soft-capped logits, an adapted output layer): the trainer keeps the unfused
        loss."""
        return None

    @property
    def hidden_skips_module(self) -> bool:
        """True where `forward_hidden` calls a submodule (a decoder) rather than `module`
        itself: FSDP's hooks on the whole module then never run for it
        (`core.parallel.sharding`)."""
        return False

    @property
    def shares_prefix(self) -> bool:
        """True when `expand_cache` works for this model: a prompt's keys and values, computed
        once, serve every row that starts with it, with the same logits and gradients as
        running each row in full (tested per family in tests/core/test_shared_prefix.py)."""
        return False

    def expand_cache(self, cache: Any, rows: Tensor, room: int = 0) -> Any:
        """The cache `forward` returned for U distinct prompts, as a cache of len(rows) rows:
        row i holds prompt `rows[i]` (int64 indices into U). `room=0` keeps autograd (the
        training forward: gradients flow back into the prompt positions); `room=n` returns a
        decoding cache with space for n more tokens (no autograd). Only when `shares_prefix`."""
        raise TypeError(f"{type(self).__name__} cannot share prompts across rows")

    def select_cache(self, cache: Any, rows: Tensor) -> Any:
        """Keep rows `rows` of a decoding cache (`expand_cache` with room): finished rows
        leave decoding. Only when `shares_prefix`."""
        raise TypeError(f"{type(self).__name__} cannot drop rows from its cache")

    @abc.abstractmethod
    def save_final(self, path: Path, *, merged: bool = True) -> None:
        """The trained model in its family's own format, loadable without pdppo where possible.
        `merged` (`TrainConfig.save_merged`): for a model with adapters, also save them merged
        into the base."""

    def save_final_state(self, path: Path, state: dict[str, Tensor]) -> None:
        """`save_final` of the weights in `state` (this model's own are sharded,
        `core.parallel.sharding`, and `state` is their gathered whole)."""
        raise TypeError(f"{type(self).__name__} cannot save a gathered state")

    def blocks(self) -> list[nn.Module]:
        """The transformer blocks, each a unit of FSDP sharding (`core.parallel.sharding`)."""
        raise TypeError(f"{type(self).__name__} cannot be sharded")

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.module.parameters()).dtype

    @property
    def has_adapters(self) -> bool:
        """True when only adapters train (LoRA): the base weights are then the initial policy,
        and `adapters_disabled` reaches them without a copy."""
        return False

    def adapters_disabled(self) -> contextlib.AbstractContextManager[Any]:
        """A context in which forward passes run the base model alone (`has_adapters` only)."""
        raise TypeError(f"{type(self).__name__} has no adapters to disable")

    def trainable(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def inference_weights(self) -> list[tuple[str, Tensor]]:
        """The whole policy as (name, tensor) pairs in its checkpoint's names, for an inference
        engine that loads it in place (`core.rollout.vllm_engine`); detached, not copied."""
        return [(n, p.detach()) for n, p in self.module.named_parameters()]

    def snapshot(self) -> dict[str, Tensor]:
        """A detached copy of the trainable weights: enough to rebuild a stale policy."""
        return {n: p.detach().clone() for n, p in self.trainable()}

    def load_snapshot(self, snap: dict[str, Tensor]) -> None:
        params = dict(self.module.named_parameters())
        with torch.no_grad():
            for n, t in snap.items():
                params[n].copy_(t)  # casts to this copy's dtype (low-precision rollouts)

    def copy_as(self, dtype: torch.dtype) -> CausalLM:
        """A frozen copy for the rollout engine, possibly in lower precision than training."""
        clone = copy.copy(self)
        clone.module = copy.deepcopy(self.module).to(dtype)
        for p in clone.module.parameters():
            p.requires_grad_(False)
        clone.module.eval()
        # The trainable names must still exist: snapshots are loaded by name.
        return clone
