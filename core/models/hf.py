"""`hf:<path or hub id>`: any Hugging Face causal LM, optionally with LoRA adapters through peft.

Hub ids work where the machine can reach the hub; tests and offline runs pass a local directory.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from core.config import ModelConfig
from core.config.fused import PROJECTED_MODEL_TYPES
from core.disk.safe_files import UnsafeFileError, check_model_dir, is_hub_id
from core.extras import require
from core.models.base import CausalLM
from core.models.hf_final import ADAPTER_DIR, adapter_only_base, merge_adapter, save_hf_final
from core.models.local_hf import make_chat_hf, make_tiny_hf

__all__ = ["HFLM", "HFTokenizer", "make_chat_hf", "make_tiny_hf", "resolve_hf_source"]

SHARED_PREFIX_MODEL_TYPES = ("llama", "qwen2", "qwen3")
"""Architectures whose training forward and rollouts run each distinct prompt once
(`CausalLM.shares_prefix`): the Llama family, with rotary positions from `position_ids` and a
cache of full-attention layers; tests/core/test_shared_prefix.py checks each one's gradients
against the full forward. Any other `model_type` runs every row in full."""

NO_CHAT_TEMPLATE = (
    "this model's tokenizer has no chat template, so records with 'messages' cannot be "
    "rendered; use records with 'prompt', or a model whose tokenizer_config.json or "
    "chat_template.jinja defines one"
)


def _transformers_at_least(version: str) -> bool:
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__) >= Version(version)


class HFTokenizer:
    """Adapts a transformers tokenizer to the trainer's needs (EOS and pad always defined)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        if tok.eos_token_id is None:
            raise ValueError("the Hugging Face tokenizer has no eos_token_id; RL needs one to stop")
        self.eos_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else self.eos_id
        self.vocab_size = len(tok)

    def encode_prompt(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=True)["input_ids"])

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tok, "chat_template", None))

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The model's own chat template with the assistant's header appended
        (`add_generation_prompt=True`), tokenized as the template writes it: special tokens
        come from the template (`{{ bos_token }}`), none are added on top."""
        if not self.has_chat_template:
            raise ValueError(NO_CHAT_TEMPLATE)
        from jinja2 import TemplateError

        try:
            ids = self.tok.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=True, tokenize=True
            )
        except TemplateError as e:  # e.g. a template that refuses a system turn
            raise ValueError(f"the model's chat template cannot render these messages: {e}") from e
        if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))


def resolve_hf_source(name: str, data_roots: Sequence[str] | None = None) -> str:
    """What `from_pretrained` gets for `model.name='hf:X'`: a hub id as is, or the checked real
    path of a local model folder.

    `from_pretrained` reads any existing folder named X, relative to the current directory
    first; so with `data_roots` (the service) a relative X must be a hub id and must not name a
    file in the worker's working directory, and an absolute X must lie under the roots once
    symlinks are resolved, with nothing in it but directories and regular files (a FIFO would
    block the loader forever, a device would never end). Without roots (a local `pdppo train`)
    a local folder may be anywhere, but is checked all the same. Raises `UnsafeFileError`.
    """
    source = name.removeprefix("hf:")
    what = f"model.name={name!r}"
    if data_roots is None:
        local = os.path.expanduser(source)
        if os.path.isabs(local) or os.path.lexists(local) or not is_hub_id(source):
            return check_model_dir(local, None, what=what)
        return source
    if os.path.isabs(source):
        return check_model_dir(source, data_roots, what=what)
    if not is_hub_id(source):
        raise UnsafeFileError(f"{what} must be an absolute path under one of {list(data_roots)}")
    if os.path.lexists(source):
        raise UnsafeFileError(
            f"{what} names a file relative to the worker's working directory, not a hub id; "
            f"give a local model as an absolute path under one of {list(data_roots)}"
        )
    return source


class HFLM(CausalLM):
    def __init__(
        self,
        cfg: ModelConfig,
        data_roots: Sequence[str] | None = None,
        *,
        folder: Path | None = None,
    ) -> None:
        """`data_roots`: the folders a local model must lie under (None: anywhere); see
        `resolve_hf_source`. `folder`: load from this local folder instead of `cfg.name` (the
        final model of an earlier job, `job:<id>`, which lies in the artifact store, not under
        the data roots); it is still checked for FIFOs and devices."""
        if cfg.lora is not None:  # before the model loads, which can take minutes
            require("model.lora (LoRA adapters)", "lora", ("peft",))
        from transformers import AutoModelForCausalLM, AutoTokenizer

        adapter: Path | None = None
        if folder is None:
            source = resolve_hf_source(cfg.name, data_roots)
        else:
            source = check_model_dir(str(folder), None, what=f"model.name={cfg.name!r}")
            base = adapter_only_base(Path(source))
            if base is not None:  # `save_merged: false`: the adapter goes onto its base
                require(f"model.name={cfg.name!r} (a LoRA adapter)", "lora", ("peft",))
                adapter = Path(source) / ADAPTER_DIR
                source = resolve_hf_source(f"hf:{base}")
        self.source = source  # what a vLLM rollout engine loads too (core.rollout.vllm_engine)
        dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
        # transformers renamed `torch_dtype` to `dtype` (4.56); older releases ignore `dtype`
        dtype_arg = "dtype" if _transformers_at_least("4.56") else "torch_dtype"
        module: Any = AutoModelForCausalLM.from_pretrained(source, **{dtype_arg: dtype})
        if adapter is not None:
            module = merge_adapter(module, adapter)
        self.hf_tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(str(adapter or source)))
        self.tokenizer = self.hf_tokenizer
        self.max_seq_len = getattr(module.config, "max_position_embeddings", None)
        self.lora = cfg.lora is not None
        if cfg.lora is not None:
            from peft import LoraConfig, get_peft_model

            module = get_peft_model(
                module,
                LoraConfig(
                    r=cfg.lora.r,
                    lora_alpha=cfg.lora.alpha,  # type: ignore[arg-type]  # peft accepts floats
                    lora_dropout=cfg.lora.dropout,
                    target_modules=cfg.lora.target_modules,
                    task_type="CAUSAL_LM",
                ),
            )
        module.eval()  # no dropout: pi and mu must differ only by the knobs the config names
        self.module = module
        # transformers 5 renamed `past_key_values` to `cache`; older releases only know the former.
        base = module.get_base_model() if cfg.lora is not None else module
        params = inspect.signature(type(base).forward).parameters
        self._logits_to_keep = "logits_to_keep" in params
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._attn = getattr(base.config, "_attn_implementation", None)
        self._shares_prefix = _can_share_prefix(base.config, self._attn)

    @property
    def has_adapters(self) -> bool:
        return self.lora

    def adapters_disabled(self) -> contextlib.AbstractContextManager[Any]:
        """peft's `disable_adapter`: the frozen base, i.e. the policy before any update."""
        if not self.lora:
            return super().adapters_disabled()
        peft_model: Any = self.module
        return cast(contextlib.AbstractContextManager[Any], peft_model.disable_adapter())

    def inference_weights(self) -> list[tuple[str, Tensor]]:
        """With LoRA, every adapted weight merged with its adapters (W + scale * B @ A, as
        peft's `get_delta_weight` computes it) under the base model's own names, the adapters'
        own tensors left out: an engine that knows nothing of LoRA samples the trained policy.
        Without LoRA, the parameters as they are."""
        if not self.lora:
            return super().inference_weights()
        from peft.tuners.lora import LoraLayer

        base = self._base_model()
        pairs: list[tuple[str, Tensor]] = []
        adapted: set[str] = set()
        with torch.no_grad():
            for name, module in base.named_modules():
                if isinstance(module, LoraLayer):
                    layer: Any = module  # a LoRA Linear: get_delta_weight is its own
                    weight = layer.get_base_layer().weight
                    for adapter in layer.active_adapters:
                        weight = weight + layer.get_delta_weight(adapter)
                    pairs.append((f"{name}.weight", weight.detach()))
                    adapted.add(f"{name}.base_layer.weight")
            for name, p in base.named_parameters():
                if name not in adapted and ".lora_" not in name:
                    pairs.append((name.replace(".base_layer.", "."), p.detach()))
        return pairs

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: Any = None,
        keep_last: int | None = None,
        use_cache: bool = True,
    ) -> tuple[Tensor, Any]:
        extra: dict[str, Any] = {self._cache_arg: cache}
        if keep_last is not None and self._logits_to_keep:
            extra["logits_to_keep"] = keep_last
        out = self.module(
            input_ids=input_ids,
            attention_mask=self._mask(input_ids, attention_mask, cache),
            position_ids=position_ids,
            use_cache=use_cache,
            **extra,
        )
        logits = out.logits
        if keep_last is not None and logits.shape[1] > keep_last:
            logits = logits[:, -keep_last:]
        return logits, getattr(out, self._cache_arg) if use_cache else None

    def _base_model(self) -> Any:
        """The transformers model under peft's wrapper, looked up each time: `copy_as` gives a
        copy its own module, which a stored reference would not follow."""
        module: Any = self.module
        return module.get_base_model() if self.lora else module

    def forward_hidden(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: Any = None,
        keep_last: int | None = None,
        use_cache: bool = True,
    ) -> tuple[Tensor, Any]:
        """The decoder alone (`get_decoder()`, LoRA layers included): what `forward` feeds to
        the output layer, with the same masks and cache."""
        if self.output_projection() is None:
            return super().forward_hidden(input_ids, attention_mask, position_ids)
        out = self._base_model().get_decoder()(
            input_ids=input_ids,
            attention_mask=self._mask(input_ids, attention_mask, cache),
            position_ids=position_ids,
            use_cache=use_cache,
            **{self._cache_arg: cache},
        )
        hidden = out.last_hidden_state
        if keep_last is not None and hidden.shape[1] > keep_last:
            hidden = hidden[:, -keep_last:]
        return hidden, getattr(out, self._cache_arg) if use_cache else None

    @property
    def hidden_skips_module(self) -> bool:
        return True  # forward_hidden runs the decoder, not the model with its lm_head

    def output_projection(self) -> tuple[Tensor, Tensor | None] | None:
        """`lm_head` of the `PROJECTED_MODEL_TYPES` (`core.config.fused`: the fused loss
        computes their logits chunk by chunk from the decoder's states), when it is a plain
        linear layer (LoRA leaves it so unless `target_modules` names it, and it is then
        frozen: `core.config.fused.adapts_output_layer`, the memory estimate's rule)."""
        base = self._base_model()
        if getattr(base.config, "model_type", None) not in PROJECTED_MODEL_TYPES:
            return None
        head = base.get_output_embeddings()
        if type(head) is not torch.nn.Linear:
            return None
        return head.weight, head.bias

    def _mask(self, input_ids: Tensor, attention_mask: Tensor, cache: Any) -> Tensor:
        mask: Tensor = attention_mask.long()
        if cache is not None and input_ids.shape[1] == 1 and self._shares_prefix:
            # one new token per row attends to every real key: the padding mask alone, in the
            # 4D form that a Llama's sdpa or eager attention takes as is, where transformers
            # would rebuild it (and read it back from the GPU) at every decoded token
            keys = attention_mask.bool()[:, None, None, :]
            if self._attn == "sdpa":
                mask = keys
            else:  # eager adds the mask to the scores
                dtype = self.dtype
                mask = torch.zeros(keys.shape, dtype=dtype, device=keys.device)
                mask = mask.masked_fill(~keys, torch.finfo(dtype).min)
        return mask

    @property
    def shares_prefix(self) -> bool:
        return self._shares_prefix

    def expand_cache(self, cache: Any, rows: Tensor, room: int = 0) -> Any:
        from core.models import hf_cache

        if not self._shares_prefix or not hf_cache.expandable(cache):
            return super().expand_cache(cache, rows, room)
        if room == 0:
            return hf_cache.expand_rows(cache, rows)
        return hf_cache.decoding_cache(cache, rows, room)

    def select_cache(self, cache: Any, rows: Tensor) -> Any:
        if not self._shares_prefix:
            return super().select_cache(cache, rows)
        cache.batch_select_indices(rows)
        return cache

    def save_final_state(self, path: Path, state: dict[str, Tensor]) -> None:
        save_hf_final(path, self.module, self.hf_tokenizer.tok, lora=self.lora, state=state)

    def blocks(self) -> list[torch.nn.Module]:
        return list(self._base_model().get_decoder().layers)

    def save_final(self, path: Path, *, merged: bool = True) -> None:
        """A standard Hugging Face folder, and PEFT's adapter folder for LoRA (`hf_final`)."""
        save_hf_final(path, self.module, self.hf_tokenizer.tok, lora=self.lora, merged=merged)


def _can_share_prefix(config: Any, attn: str | None) -> bool:
    """A Llama-family model (`SHARED_PREFIX_MODEL_TYPES`) with sdpa or eager attention whose
    cache, as transformers builds it for this config, is made of plain full-attention layers
    (no sliding window): what `core.models.hf_cache` can expand. transformers 4 has no
    per-layer caches: nothing is shared there."""
    if getattr(config, "model_type", None) not in SHARED_PREFIX_MODEL_TYPES:
        return False
    if attn not in ("sdpa", "eager"):
        return False
    try:
        from transformers.cache_utils import DynamicCache

        from core.models import hf_cache
    except ImportError:
        return False
    return hf_cache.expandable(DynamicCache(config=config))
