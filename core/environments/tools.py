"""Tool calls in the model's text, in the Hermes / Qwen format:

    <tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>

The local chat model's template (`core.models.local_hf.LLAMA3_CHAT_TEMPLATE`, Llama 3's layout
without its tool preamble) has no tool format of its own, so this one is used: it is what Qwen 2.5
and 3 and Hermes models are trained to write, one JSON object per call, several calls per turn
allowed. A tool's result goes back as a chat message `{"role": "tool", "content": ...}`, which
the model's template renders like any turn (`<|start_header_id|>tool<|end_header_id|>...`).

Parsing reads the decoded text, whatever ids spelt it (the model may write `<tool_call>` as one
added token or character by character): the trainer keeps the ids, the parser the meaning.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's `name` and `arguments`, or `error` when the text between the tags
    is not such a call (the environment answers the error; the model learns from it)."""

    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>...</tool_call>` in `text`, in order."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError) as e:
            calls.append(ToolCall(error=f"not JSON: {type(e).__name__}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ToolCall(error='a call is {"name": ..., "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if not isinstance(args, dict):
            calls.append(ToolCall(name=obj["name"], error="arguments must be an object"))
            continue
        calls.append(ToolCall(name=obj["name"], arguments=args))
    return calls


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text of one call, compact (a character-level model writes every character)."""
    body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
    return f"<tool_call>{body}</tool_call>"
