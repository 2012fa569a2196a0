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
from core.models.base import CausalLM
from core.models.local_hf import make_chat_hf, make_tiny_hf
from core.safe_files import UnsafeFileError, check_model_dir, is_hub_id

__all__ = ["HFLM", "HFTokenizer", "make_chat_hf", "make_tiny_hf", "resolve_hf_source"]

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
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if folder is None:
            source = resolve_hf_source(cfg.name, data_roots)
        else:
            source = check_model_dir(str(folder), None, what=f"model.name={cfg.name!r}")
        dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
        # transformers renamed `torch_dtype` to `dtype` (4.56); older releases ignore `dtype`
        dtype_arg = "dtype" if _transformers_at_least("4.56") else "torch_dtype"
        module: Any = AutoModelForCausalLM.from_pretrained(source, **{dtype_arg: dtype})
        self.hf_tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(source))
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

    @property
    def has_adapters(self) -> bool:
        return self.lora

    def adapters_disabled(self) -> contextlib.AbstractContextManager[Any]:
        """peft's `disable_adapter`: the frozen base, i.e. the policy before any update."""
        if not self.lora:
            return super().adapters_disabled()
        peft_model: Any = self.module
        return cast(contextlib.AbstractContextManager[Any], peft_model.disable_adapter())

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: Any = None,
        keep_last: int | None = None,
    ) -> tuple[Tensor, Any]:
        extra: dict[str, Any] = {self._cache_arg: cache}
        if keep_last is not None and self._logits_to_keep:
            extra["logits_to_keep"] = keep_last
        out = self.module(
            input_ids=input_ids,
            attention_mask=attention_mask.long(),
            position_ids=position_ids,
            use_cache=True,
            **extra,
        )
        logits = out.logits
        if keep_last is not None and logits.shape[1] > keep_last:
            logits = logits[:, -keep_last:]
        return logits, getattr(out, self._cache_arg)

    def save_final(self, path: Path) -> None:
        """Safetensors via save_pretrained; LoRA adapters are merged so the result loads alone."""
        import copy

        path.mkdir(parents=True, exist_ok=True)
        module: Any = self.module
        if self.lora:
            module = copy.deepcopy(module).merge_and_unload()
        module.save_pretrained(str(path), safe_serialization=True)
        self.hf_tokenizer.tok.save_pretrained(str(path))
