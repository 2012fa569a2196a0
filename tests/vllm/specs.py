"""The job spec the vLLM tests train: the chat example's data and model shape, small groups,
a high learning rate so that every update moves the policy measurably."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def chat_spec(
    model: Path, data: Path, steps: int, lora: bool = False, **rollout: Any
) -> dict[str, Any]:
    return {
        "name": "vllm-chat",
        "train": {
            "model": {"name": f"hf:{model}", **({"lora": {"r": 4, "alpha": 8}} if lora else {})},
            "task": {
                "name": "jsonl",
                "path": str(data / "chat_math.jsonl"),
                "grader": {"type": "numeric", "tolerance": 20.0},
            },
            "rollout": {
                "engine": "vllm",
                "vllm_memory": 0.1,
                "prompts_per_step": 4,
                "group_size": 4,
                "max_new_tokens": 4,
                **rollout,
            },
            "algorithm": {"top_k": 8},
            "optim": {"lr": 1e-2},
            "steps": steps,
            "checkpoint_every": 1,
            "seed": 3,
            "device": "cpu",
        },
    }
