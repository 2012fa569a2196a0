"""How many tokens a prompt can take, as an upper bound, without loading a tokenizer.

It exists apart because token counts need neither the model's weights nor its memory: only the
task (the built-in tasks' prompt formats, or the longest prompt of a jsonl dataset) and a bound
on what a tokenizer adds. Both the token limits and the memory estimate start from it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from core.budget.shapes import ModelShape
from core.budget.units import MIB
from core.config import BUILTIN_TASKS, TaskConfig, TrainConfig
from core.disk.safe_files import iter_lines

# Special tokens a Hugging Face tokenizer may add around a prompt (BOS, a SentencePiece prefix
# space, ...). On top of one token per UTF-8 byte, which bounds byte-level BPE and SentencePiece
# with byte fallback alike.
HF_SPECIAL_TOKENS = 4
# A sequence bound for models whose config.json we cannot read (used only for token counts).
UNKNOWN_SEQ_LEN = 2048
# A jsonl dataset is scanned for its longest prompt up to this size; beyond, the bound is the
# model's sequence length.
MAX_SCAN_BYTES = 64 * MIB


def _builtin_prompt_chars(task: TaskConfig) -> int:
    """Longest prompt of core/tasks/builtin.py: `{name} {digits}=` or `{a}+{b}=`."""
    if task.name == "arithmetic":
        return 2 * task.max_len + 2
    return len(task.name) + 2 + task.max_len


def builtin_answer_chars(task: TaskConfig) -> int:
    return task.max_len + 1 if task.name == "arithmetic" else task.max_len


def _longest_jsonl_prompt(path: Path, data_roots: Sequence[str] | None) -> int | None:
    """UTF-8 bytes of the longest prompt of a readable jsonl file of at most MAX_SCAN_BYTES
    (read line by line through `core.disk.safe_files`); None when that cannot be had."""
    longest = 0
    try:
        for _, line in iter_lines(path, data_roots, max_bytes=MAX_SCAN_BYTES):
            if line.strip():
                row = json.loads(line)
                longest = max(longest, len(str(row["prompt"]).encode("utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return longest


def prompt_tokens(
    cfg: TrainConfig,
    shape: ModelShape,
    *,
    read_files: bool = True,
    data_roots: Sequence[str] | None = None,
) -> tuple[int, str | None]:
    """An upper bound on one prompt's tokens, and a note when it is only a conservative guess.

    Built-in tasks: the longest prompt (task.max_len digits) in bytes, +1 for BOS with the byte
    tokenizer of builtin:tiny, + HF_SPECIAL_TOKENS otherwise (at most one token per byte).
    jsonl: the longest prompt of the file when it is readable here, else the model's sequence
    length less the response; reasoning_gym: that bound too (its rows do not exist yet)."""
    specials = 1 if shape.tiny else HF_SPECIAL_TOKENS
    if cfg.task.name in BUILTIN_TASKS:
        return _builtin_prompt_chars(cfg.task) + specials, None
    seq = shape.max_seq_len or UNKNOWN_SEQ_LEN
    bound = max(1, seq - cfg.rollout.max_new_tokens)
    longest = None
    if cfg.task.name in ("reasoning_gym", "environment"):
        # an environment's episodes (prompt, turns and inserted tokens) are cut at the model's
        # sequence length too (core.rollout.episodes): the bound holds for them
        note = (
            f"task.name={cfg.task.name!r}: its prompts are generated when the job starts, so "
            f"they are assumed as long as the model's sequence allows ({bound} tokens)"
        )
        if shape.max_seq_len is None:
            note += f"; the model's sequence length is unknown, {UNKNOWN_SEQ_LEN} assumed"
        return bound, note
    if read_files and cfg.task.path is not None:
        longest = _longest_jsonl_prompt(Path(cfg.task.path).expanduser(), data_roots)
    if longest is None:
        # an uploaded file (task.file) is not opened by the estimate: say so, not "path"
        source = (
            f"task.file {cfg.task.file}: the uploaded file's prompts are not measured"
            if cfg.task.path is None and cfg.task.file is not None
            else "task.path is not readable here"
        )
        note = (
            f"{source}: prompts are assumed as long as the model's sequence allows ({bound} tokens)"
        )
        if shape.max_seq_len is None:
            note += f"; the model's sequence length is unknown, {UNKNOWN_SEQ_LEN} assumed"
        return bound, note
    return min(longest + specials, bound), None
