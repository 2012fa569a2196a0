"""Small Hugging Face models built on this machine, no hub download: for tests and the examples.

Both are `LlamaForCausalLM`s with a character-level tokenizer (`tokenizers` WordLevel over single
characters, wrapped in `PreTrainedTokenizerFast`), saved with `save_pretrained` so that they load
through `hf:<folder>` exactly like a downloaded model. One character per token suits the digit
tasks these models learn: every digit is its own token, as in the built-in byte tokenizer.

- `make_tiny_hf`: random weights, a few hundred filler tokens so that a top-K view of the
  behavior policy is a real truncation; no chat template (text prompts only).
- `make_chat_hf`: a Llama-3-like chat template (`<|start_header_id|>role<|end_header_id|>`,
  turns ended by `<|eot_id|>`, the EOS), so records with `messages` render as with a real
  instruct model; heads of 64 dimensions, which vLLM's CPU attention kernels support.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
"""Llama 3's instruct layout, without its date and tool preamble."""

CHAT_SPECIALS = ("<|pad|>", "<|begin_of_text|>", "<|eot_id|>", "<|unk|>")
CHAT_HEADERS = ("<|start_header_id|>", "<|end_header_id|>")
PRINTABLE = ("\n", *(chr(c) for c in range(32, 127)))
"""Newline (chat templates put it after every header) and printable ASCII."""


def char_tokenizer(
    specials: tuple[str, str, str, str],
    chars: tuple[str, ...],
    *,
    extra_specials: tuple[str, ...] = (),
    fillers: int = 0,
    chat_template: str | None = None,
    add_bos: bool = False,
) -> Any:
    """A `PreTrainedTokenizerFast` with one token per character.

    `specials` are (pad, bos, eos, unk), ids 0-3; `extra_specials` (chat headers) come next and
    are matched whole before characters are split; then `chars`, then `fillers` tokens `<wN>`
    that no text encodes to. `add_bos`: plain-text prompts start with the BOS token, as Llama's
    do (a chat template that writes `{{ bos_token }}` itself is not given a second one:
    `apply_chat_template` tokenizes without special tokens).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    pad, bos, eos, unk = specials
    vocab = [*specials, *extra_specials, *chars, *(f"<w{i}>" for i in range(fillers))]
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token=unk))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()
    if add_bos:
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, 1)]
        )
    kwargs: dict[str, Any] = {"chat_template": chat_template} if chat_template else {}
    if extra_specials:
        kwargs["additional_special_tokens"] = list(extra_specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token=pad, bos_token=bos, eos_token=eos, unk_token=unk, **kwargs
    )


@dataclass(frozen=True)
class LlamaShape:
    """The dimensions of a locally built Llama."""

    hidden: int = 128
    heads: int = 2
    kv_heads: int = 2
    layers: int = 2
    intermediate: int = 512
    max_positions: int = 256


MODEL_TYPES = ("llama", "qwen2", "qwen3", "gpt2")
"""The families `model_config` builds: the Llama-style ones the fused loss projects
(`core.config.fused.PROJECTED_MODEL_TYPES`) and GPT-2, which it does not."""


def save_llama(
    path: Path, tokenizer: Any, shape: LlamaShape, seed: int, dtype: torch.dtype | None = None
) -> Any:
    """Random Llama weights for `tokenizer`'s vocabulary (in `dtype`, else float32), both saved
    into `path`; returns the model (bench/gpu_check.py counts its parameters)."""
    return save_model(path, tokenizer, shape, seed=seed, dtype=dtype)


def save_model(
    path: Path,
    tokenizer: Any,
    shape: LlamaShape,
    *,
    model_type: str = "llama",
    tied: bool = False,
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> Any:
    """`save_llama` for any of `MODEL_TYPES`, its output layer tied to the input embedding
    or not; returns the model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config(tokenizer, shape, model_type, tied=tied))
    if dtype is not None:
        torch.nn.Module.to(model, dtype)  # in place (transformers types its .to oddly)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    tokenizer.save_pretrained(str(path))
    return model


def model_config(
    tokenizer: Any, shape: LlamaShape, model_type: str = "llama", *, tied: bool = False
) -> Any:
    """The transformers config of `save_model`'s model, alone: what the memory estimate reads
    (`core.budget`), without the weights (bench/gpu_check.py sizes its 0.8B model so)."""
    from transformers import AutoConfig

    ids = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "tie_word_embeddings": tied,
    }
    if model_type == "gpt2":
        return AutoConfig.for_model(
            "gpt2",
            n_embd=shape.hidden,
            n_layer=shape.layers,
            n_head=shape.heads,
            n_inner=shape.intermediate,
            n_positions=shape.max_positions,
            **ids,
        )
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not one of {MODEL_TYPES}")
    return AutoConfig.for_model(
        model_type,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads,  # Qwen3's default is 128, whatever the width
        max_position_embeddings=shape.max_positions,
        **ids,
    )


def make_tiny_hf(path: Path, *, vocab_words: int = 600, seed: int = 0) -> Path:
    """Save a tiny random Llama and a character tokenizer to `path`, built locally (no hub).

    The tokenizer knows single characters, digits and enough filler tokens to make
    `vocab_words` entries besides its specials, so that top-K truncation is real.
    """
    chars = PRINTABLE[1:]  # no newline: ids stay what tests written against them expect
    tok = char_tokenizer(
        ("<pad>", "<s>", "</s>", "<unk>"), chars, fillers=max(0, vocab_words - len(chars))
    )
    shape = LlamaShape(hidden=32, heads=4, kv_heads=2, layers=2, intermediate=64, max_positions=128)
    save_llama(path, tok, shape, seed)
    return path


TOOL_TOKENS = ("<tool_call>", "</tool_call>")
"""The tool-call tags as whole tokens (added, not special: decoding keeps them), as Qwen's
tokenizer has them (`core.environments.tools`)."""


def make_chat_hf(
    path: Path, *, shape: LlamaShape | None = None, seed: int = 0, tool_tokens: bool = False
) -> Path:
    """Save a small random Llama with a Llama-3-like chat template to `path` (no hub).

    The default shape (hidden 128, 2 heads of 64, 2 layers, 0.5M parameters) learns small
    arithmetic in minutes on a laptop CPU. The EOS is `<|eot_id|>`, the end of a turn, so a
    completion stops where the assistant's reply ends. `tool_tokens`: `TOOL_TOKENS` are whole
    tokens too, after every other id (so the others keep theirs); the text `<tool_call>` then
    encodes to one id, though a model may still write it character by character, which a
    re-encoding would not give back (tests/core/test_episodes.py).
    """
    tok = char_tokenizer(
        CHAT_SPECIALS,
        PRINTABLE,
        extra_specials=CHAT_HEADERS,
        chat_template=LLAMA3_CHAT_TEMPLATE,
        add_bos=True,
    )
    if tool_tokens:
        tok.add_tokens(list(TOOL_TOKENS))
    save_llama(path, tok, shape or LlamaShape(), seed)
    return path
