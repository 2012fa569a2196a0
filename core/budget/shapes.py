"""What a model is, read without loading it: parameter counts and the shape figures (vocabulary,
width, depth, KV width) that the token and memory estimates need.

It exists apart because it is the only part of the budget that reads model files, and the one
that must track other libraries' layouts (transformers' tensor names, peft's LoRA matching).

A built-in model's figures follow from its dims (`tiny_param_count`, exact). An `hf:` model's
come from its safetensors headers (the first 8 bytes of a `.safetensors` file give the length of
a JSON header that lists every tensor's shape), else from `config.json`; files are read only
when the spec names them, and only headers. A hub id that is neither a local folder nor in the
local Hugging Face cache has an unknown parameter count (`ModelShape.params is None`), and then
the budget has no memory estimate. An earlier job's final model (`job:<id>`) is read the same
way from the artifact-store folder the caller resolves it to (the API and the worker), in
whichever family it was saved.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import math
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.budget.units import MIB
from core.config import LoraConfig, TinyModelConfig, TrainConfig
from core.disk.safe_files import open_regular_file

# The byte tokenizer of builtin:tiny (core/models/tiny.py): 4 specials + 256 bytes + 252 reserved.
TINY_VOCAB = 512
# `core.models.hf.SHARED_PREFIX_MODEL_TYPES`, restated (this package imports no torch; tests check
# that the two agree): the architectures whose training forward runs each distinct prompt once.
SHARED_PREFIX_MODEL_TYPES = ("llama", "qwen2", "qwen3")
# A tensor of one of the repeated blocks (`model.layers.3.`, GPT-2's `transformer.h.3.`)
_BLOCK = re.compile(r"\.(layers|h|blocks)\.\d+\.")
# Safetensors headers are JSON text; refuse to read a "header" larger than this.
MAX_HEADER_BYTES = 100 * MIB


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know of a model, read without loading it (None: unknown)."""

    source: str  # where the figures come from, for humans
    params: int | None
    trainable: int | None
    vocab: int | None = None
    hidden: int | None = None
    layers: int | None = None
    heads: int | None = None
    kv_dim: int | None = None  # per layer and token: n_kv_heads * head_dim
    intermediate: int | None = None
    max_seq_len: int | None = None
    tiny: bool = False
    model_type: str | None = None  # config.json's (an `hf:` model's architecture)
    shares_prefix: bool = False  # a training forward runs each distinct prompt once
    # parameters outside the repeated blocks (embeddings, final norm, output layer): the unit
    # that FSDP keeps gathered through a forward and backward (`core.parallel.sharding`)
    root_params: int | None = None


def tiny_param_count(d_model: int, n_layers: int, max_seq_len: int, vocab: int = TINY_VOCAB) -> int:
    """Exactly `sum(p.numel())` of core.models.tiny.TinyTransformer.

    Token and position embeddings (V*d + S*d); per block two LayerNorms (2*2d), qkv (3d*d + 3d),
    proj (d*d + d) and the MLP (4d*d + 4d, d*4d + d), i.e. 12d^2 + 13d; the final LayerNorm
    (2d) and an untied head without bias (V*d).
    """
    d = d_model
    return 2 * vocab * d + max_seq_len * d + n_layers * (12 * d * d + 13 * d) + 2 * d


def _tiny_shape(t: TinyModelConfig, name: str = "builtin:tiny") -> ModelShape:
    params = tiny_param_count(t.d_model, t.n_layers, t.max_seq_len, t.vocab_size)
    return ModelShape(
        source=f"{name} (d_model={t.d_model}, n_layers={t.n_layers}, max_seq_len={t.max_seq_len})",
        params=params,
        trainable=params,
        vocab=t.vocab_size,
        hidden=t.d_model,
        layers=t.n_layers,
        heads=t.n_heads,
        kv_dim=t.d_model,
        intermediate=4 * t.d_model,
        max_seq_len=t.max_seq_len,
        tiny=True,
        shares_prefix=True,
        root_params=params - t.n_layers * (12 * t.d_model**2 + 13 * t.d_model),
    )


def read_safetensors_header(
    path: Path, data_roots: Sequence[str] | None = None
) -> dict[str, list[int]]:
    """Tensor name -> shape from a .safetensors file, reading only its header.

    The format: 8 bytes little-endian header length n, then n bytes of JSON mapping each tensor
    name to {dtype, shape, data_offsets} (plus an optional `__metadata__`). The file is opened
    by `core.disk.safe_files` (a regular file under `data_roots`, never a FIFO or a device)."""
    with open_regular_file(path, data_roots, max_bytes=None) as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (size,) = struct.unpack("<Q", head)
        if size > MAX_HEADER_BYTES:
            raise ValueError(f"{path}: safetensors header of {size} bytes is implausibly large")
        header = json.loads(fh.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: safetensors header is not a JSON object")
    return {
        name: [int(x) for x in entry["shape"]]
        for name, entry in header.items()
        if name != "__metadata__"
    }


def _read_json(path: Path, data_roots: Sequence[str] | None) -> Any:
    with open_regular_file(path, data_roots, max_bytes=MAX_HEADER_BYTES) as fh:
        return json.loads(fh.read())


def _safetensors_files(folder: Path, data_roots: Sequence[str] | None) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index, data_roots).get("weight_map", {})
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    return sorted(folder.glob("*.safetensors"))


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model's figures under `text_config`."""
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def _get(config: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


_MOE_KEYS = ("num_experts", "n_routed_experts", "moe_intermediate_size")


def _config_tensors(config: dict[str, Any]) -> list[tuple[str, list[int]]] | None:
    """The tensors a standard architecture builds from config.json (None: not one we know).

    Llama-style decoders (Llama, Mistral, Qwen2, Gemma, ..., Mixtral's experts) and GPT-2-style
    ones; names follow transformers so that LoRA's module matching applies to them too."""
    c = _text_config(config)
    vocab = _get(c, "vocab_size")
    tie = bool(c.get("tie_word_embeddings", False))
    if any(key in c for key in _MOE_KEYS) or vocab is None:
        return None
    h, layers, inter = (
        _get(c, "hidden_size"),
        _get(c, "num_hidden_layers"),
        _get(c, "intermediate_size"),
    )
    if h is not None and layers is not None and inter is not None:
        heads = _get(c, "num_attention_heads") or 1
        kv_heads = _get(c, "num_key_value_heads") or heads
        head_dim = _get(c, "head_dim") or h // heads
        bias = bool(c.get("attention_bias", False)) or c.get("model_type") == "qwen2"
        experts = _get(c, "num_local_experts") or 0
        out: list[tuple[str, list[int]]] = [("model.embed_tokens.weight", [vocab, h])]
        for i in range(layers):
            p = f"model.layers.{i}"
            for name, rows in (("q_proj", heads * head_dim), ("k_proj", kv_heads * head_dim)):
                out.append((f"{p}.self_attn.{name}.weight", [rows, h]))
                if bias:
                    out.append((f"{p}.self_attn.{name}.bias", [rows]))
            out.append((f"{p}.self_attn.v_proj.weight", [kv_heads * head_dim, h]))
            if bias:
                out.append((f"{p}.self_attn.v_proj.bias", [kv_heads * head_dim]))
            out.append((f"{p}.self_attn.o_proj.weight", [h, heads * head_dim]))
            mlps = [f"{p}.block_sparse_moe.experts.{e}" for e in range(experts)] or [f"{p}.mlp"]
            names = ("w1", "w3", "w2") if experts else ("gate_proj", "up_proj", "down_proj")
            for mlp in mlps:
                out.append((f"{mlp}.{names[0]}.weight", [inter, h]))
                out.append((f"{mlp}.{names[1]}.weight", [inter, h]))
                out.append((f"{mlp}.{names[2]}.weight", [h, inter]))
            if experts:
                out.append((f"{p}.block_sparse_moe.gate.weight", [experts, h]))
            out.append((f"{p}.input_layernorm.weight", [h]))
            out.append((f"{p}.post_attention_layernorm.weight", [h]))
        out.append(("model.norm.weight", [h]))
        if not tie:
            out.append(("lm_head.weight", [vocab, h]))
        return out
    n, layers, positions = _get(c, "n_embd"), _get(c, "n_layer"), _get(c, "n_positions")
    if n is not None and layers is not None and positions is not None:
        inner = _get(c, "n_inner") or 4 * n
        out = [("transformer.wte.weight", [vocab, n]), ("transformer.wpe.weight", [positions, n])]
        for i in range(layers):
            p = f"transformer.h.{i}"
            out += [
                (f"{p}.ln_1.weight", [n]),
                (f"{p}.ln_1.bias", [n]),
                (f"{p}.attn.c_attn.weight", [n, 3 * n]),
                (f"{p}.attn.c_attn.bias", [3 * n]),
                (f"{p}.attn.c_proj.weight", [n, n]),
                (f"{p}.attn.c_proj.bias", [n]),
                (f"{p}.ln_2.weight", [n]),
                (f"{p}.ln_2.bias", [n]),
                (f"{p}.mlp.c_fc.weight", [n, inner]),
                (f"{p}.mlp.c_fc.bias", [inner]),
                (f"{p}.mlp.c_proj.weight", [inner, n]),
                (f"{p}.mlp.c_proj.bias", [n]),
            ]
        out += [("transformer.ln_f.weight", [n]), ("transformer.ln_f.bias", [n])]
        if not tie and "tie_word_embeddings" in c:
            out.append(("lm_head.weight", [vocab, n]))
        return out
    return None


# Modules peft's "all-linear" leaves alone: the output layer (and embeddings, which are not
# linear layers).
_NOT_LINEAR = ("embed", "wte", "wpe", "lm_head", "embed_out", "output_layer")


def lora_param_count(tensors: Iterable[tuple[str, list[int]]], lora: LoraConfig) -> int:
    """Adapter parameters peft adds: r * (in + out) per adapted 2-D weight (A: r x in,
    B: out x r). Matching follows peft: a module is adapted when its name equals a target or
    ends with `.target`; "all-linear" takes every linear layer but the output layer."""
    total = 0
    for name, shape in tensors:
        if len(shape) != 2 or not name.endswith(".weight"):
            continue
        module = name.removesuffix(".weight")
        leaf = module.rsplit(".", 1)[-1]
        if lora.target_modules == "all-linear":
            if any(mark in leaf for mark in _NOT_LINEAR) or "norm" in leaf:
                continue
        elif not any(module == t or module.endswith(f".{t}") for t in lora.target_modules):
            continue
        total += lora.r * (shape[0] + shape[1])
    return total


def _hub_cache_dir(repo_id: str) -> Path | None:
    """The local Hugging Face cache snapshot of a hub id, if config.json is cached there."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # no hub library, a malformed id: simply unknown
        return None
    return Path(found).parent if isinstance(found, str) else None


def _hf_shape(cfg: TrainConfig, read_files: bool, data_roots: Sequence[str] | None) -> ModelShape:
    source = cfg.model.name.removeprefix("hf:")
    if not read_files:
        return ModelShape(source=f"{source}: not read here", params=None, trainable=None)
    folder = Path(source).expanduser()
    roots = data_roots
    if not folder.is_dir():
        cached = _hub_cache_dir(source)
        if cached is None:
            return ModelShape(
                source=f"{source}: not a local folder here, nor in the Hugging Face cache",
                params=None,
                trainable=None,
            )
        folder, roots = cached, None  # the cache's own symlinks lead into its blobs folder
    return _folder_shape(cfg, folder, roots, source)


def _folder_shape(
    cfg: TrainConfig, folder: Path, roots: Sequence[str] | None, source: str
) -> ModelShape:
    """A Hugging Face model folder's figures: safetensors headers, else config.json."""
    unknown = ModelShape(source=f"{source}: parameter count unknown", params=None, trainable=None)
    try:
        config = _read_json(folder / "config.json", roots)
    except (OSError, ValueError):  # UnsafeFileError is a ValueError
        config = {}
    c = _text_config(config) if isinstance(config, dict) else {}
    tensors: list[tuple[str, list[int]]] | None = None
    how = ""
    try:
        files = _safetensors_files(folder, roots)
        tensors = [item for f in files for item in read_safetensors_header(f, roots).items()]
        how = f"safetensors headers ({len(files)} file{'s' if len(files) > 1 else ''})"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        tensors = None
    if not tensors and c:
        tensors = _config_tensors(c)
        how = "config.json"
    if not tensors:
        return unknown
    base = sum(math.prod(shape) for _, shape in tensors)
    root = sum(math.prod(shape) for name, shape in tensors if not _BLOCK.search(name))
    lora = cfg.model.lora
    adapters = lora_param_count(tensors, lora) if lora is not None else 0
    hidden = _get(c, "hidden_size", "n_embd", "d_model")
    heads = _get(c, "num_attention_heads", "n_head")
    kv_heads = _get(c, "num_key_value_heads") or heads
    head_dim = _get(c, "head_dim") or (hidden // heads if hidden and heads else None)
    return ModelShape(
        source=f"{source}: {how}",
        params=base + adapters,
        root_params=root,
        trainable=adapters if lora is not None else base,
        vocab=_get(c, "vocab_size"),
        hidden=hidden,
        layers=_get(c, "num_hidden_layers", "n_layer"),
        heads=heads,
        kv_dim=kv_heads * head_dim if kv_heads and head_dim else hidden,
        intermediate=_get(c, "intermediate_size", "n_inner") or (4 * hidden if hidden else None),
        max_seq_len=_get(c, "max_position_embeddings", "n_positions"),
        # the top level's, as transformers' loader reads it (not a nested text_config's)
        model_type=_model_type(config),
        shares_prefix=_model_type(config) in SHARED_PREFIX_MODEL_TYPES
        and not _sliding(c)
        and _transformers_major() >= 5,
    )


def _model_type(config: Any) -> str | None:
    value = config.get("model_type") if isinstance(config, dict) else None
    return value if isinstance(value, str) else None


def _sliding(c: dict[str, Any]) -> bool:
    """A sliding window on some layer: their caches are not the full ones that prefix sharing
    expands (`core.models.hf_cache.expandable`)."""
    layer_types = c.get("layer_types")
    if isinstance(layer_types, list) and any(t != "full_attention" for t in layer_types):
        return True
    return bool(c.get("use_sliding_window"))


@functools.cache
def _transformers_major() -> int:
    """The major version of the transformers installed here, without importing it (0: none).
    Prefix sharing needs its per-layer caches (5 and later); the worker estimates again with
    its own before it loads the model."""
    try:
        return int(importlib.metadata.version("transformers").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 0


def _job_shape(cfg: TrainConfig, model_dir: Path | None) -> ModelShape:
    """An earlier job's final model (`job:<id>`), from the folder the caller resolved it to:
    builtin:tiny's dims from the config.json `TinyLM.save_final` writes, else a Hugging Face
    folder. The folder is in the artifact store, which the service writes itself: it is read
    under its own root, not the data roots."""
    name = cfg.model.name
    if model_dir is None or not model_dir.is_dir():
        return ModelShape(
            source=f"{name}: the final model is not visible here (the worker sizes it)",
            params=None,
            trainable=None,
        )
    roots = [str(model_dir)]
    try:
        meta = _read_json(model_dir / "config.json", roots)
    except (OSError, ValueError):
        meta = None
    if isinstance(meta, dict) and meta.get("model") == "builtin:tiny":
        try:
            return _tiny_shape(TinyModelConfig.model_validate(meta["tiny"]), name)
        except (KeyError, ValueError):
            return ModelShape(source=f"{name}: unreadable config.json", params=None, trainable=None)
    return _folder_shape(cfg, model_dir, roots, name)


def model_shape(
    cfg: TrainConfig,
    *,
    read_files: bool = True,
    data_roots: Sequence[str] | None = None,
    model_dir: Path | None = None,
) -> ModelShape:
    """The model's figures: built-in from its dims, `hf:` from headers/config.json when visible,
    `job:<id>` from the final model in `model_dir` (the folder the caller resolved it to).

    `read_files=False` reads nothing (the API passes it for paths a tenant may not read); files
    are opened only as regular files under `data_roots` (None: anywhere, as `pdppo train`)."""
    if cfg.model.name == "builtin:tiny":
        return _tiny_shape(cfg.model.tiny)
    if cfg.model.name.startswith("job:"):
        return _job_shape(cfg, model_dir if read_files else None)
    return _hf_shape(cfg, read_files, data_roots)
