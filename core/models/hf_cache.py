"""KV caches for Hugging Face models: a prompt's keys and values shared by its rows, and decoding
without re-copying the cache at every token.

transformers 5's `DynamicCache` keeps one `DynamicLayer` per decoder layer, whose `update`
concatenates the new keys to all the old ones (a copy of the whole cache per token and layer).
`PreallocatedLayer` is a `DynamicLayer` whose keys and values live in (B, H, capacity, D) buffers
written in place, one column per token; what it hands to attention is a view of the columns
written, so masks and lengths are the ones a `DynamicLayer` gives. Dropping finished rows
(`batch_select_indices`) copies the buffers once.

Only caches made of plain `DynamicLayer`s (full attention, the Llama family) are expanded; sliding
window, linear-attention or quantized layers keep transformers' own caches (`expandable` says no).
Imported by `core.models.hf` when first needed: transformers 4 has no `DynamicLayer` (the import
fails and nothing is shared there).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer


def expandable(cache: Any) -> bool:
    """True for a cache whose every layer is a plain `DynamicLayer`."""
    layers: list[Any] = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def expand_rows(cache: Any, rows: Tensor) -> Any:
    """`cache` (from a forward over distinct prompts) with row i = its row `rows[i]`, in place;
    an index, so gradients flow back to the prompt positions."""
    cache.batch_select_indices(rows)
    return cache


def decoding_cache(cache: Any, rows: Tensor, room: int) -> Cache:
    """A new cache of `PreallocatedLayer`s: `cache`'s rows `rows`, with `room` free columns."""
    layers: list[Any] = [
        PreallocatedLayer(layer.keys, layer.values, rows, room) for layer in cache.layers
    ]
    return Cache(layers=layers)


class PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` over preallocated buffers (see the module docstring)."""

    is_croppable = False

    def __init__(self, keys: Tensor, values: Tensor, rows: Tensor, room: int) -> None:
        """Rows `rows` of `keys`/`values` (B, H, T, D), with `room` free columns."""
        super().__init__()
        self.length = int(keys.shape[-2])
        self._k = _buffer(keys, rows, room)
        self._v = _buffer(values, rows, room)
        self.device = keys.device
        self.is_initialized = True
        self._view()

    def _view(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        end = self.length + key_states.shape[-2]
        if end > self._k.shape[-2]:
            raise ValueError(f"KV buffer of {self._k.shape[-2]} columns cannot take column {end}")
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self._view()
        return self._k[:, :, :end], self._v[:, :, :end]

    def batch_select_indices(self, indices: Tensor) -> None:
        self._k = self._k[indices]
        self._v = self._v[indices]
        self._view()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._k = self._k.repeat_interleave(repeats, dim=0)
        self._v = self._v.repeat_interleave(repeats, dim=0)
        self._view()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("pdppo's decoding cache is never cropped")


def _buffer(src: Tensor, rows: Tensor, room: int) -> Tensor:
    """(len(rows), H, T + room, D), its first T columns `src[rows]`."""
    t = src.shape[2]
    buf = src.new_empty(len(rows), src.shape[1], t + room, src.shape[3])
    buf[:, :, :t] = src[rows]
    return buf
