"""How a budget reads for people: bytes and counts in units, and the lines the CLI prints.

It exists apart because it formats JSON data, not only `Budget` objects: `render` and
`render_limits` take `Budget.to_dict()` or the API's reply alike, so that `pdppo train
--dry-run` (a local estimate) and the server's validation (`pdppo/commands/jobs.py`) print the
same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from core.budget.units import GIB, MIB

if TYPE_CHECKING:
    from core.budget import Budget


def _short(value: float) -> str:
    text = f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return text.removesuffix(".0")


def format_bytes(n: float) -> str:
    """Binary units, one decimal, trailing .0 dropped: '37.2 GiB', '12 GiB', '640 KiB'."""
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= size:
            return f"{_short(n / size)} {unit}"
    return f"{int(n)} B"


def format_count(n: float) -> str:
    """Decimal units: '12.9B', '336M', '46.6K', '512'."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{_short(n / size)}{unit}"
    return str(int(n))


def describe(budget: Budget) -> Iterator[str]:
    """Human-readable lines of a budget (the CLI's dry run prints them)."""
    yield from render(budget.to_dict())


def render(data: dict[str, Any]) -> Iterator[str]:
    """Lines describing a budget given as JSON data (`Budget.to_dict()` or the API's estimate),
    so that the CLI prints a local estimate and the server's the same way."""

    def count(value: Any) -> str:
        return "unknown" if value is None else f"{format_count(value)} ({value:,})"

    yield f"model            {data.get('model_source', '?')}"
    yield f"parameters       {count(data.get('params'))}"
    yield f"trainable        {count(data.get('trainable_params'))}"
    yield (
        f"tokens/step      {count(data.get('tokens_per_step'))} = "
        f"{data.get('sequences_per_step'):,} sequences x {data.get('sequence_tokens')} tokens "
        f"(prompt <= {data.get('prompt_tokens')})"
    )
    yield f"total tokens     {count(data.get('total_tokens'))} over {data.get('steps')} steps"
    peak = data.get("peak_memory_bytes")
    device = data.get("device", "?")
    if peak is None:
        yield f"peak memory      unknown ({device})"
    else:
        phases = ", ".join(data.get("peak_phases", []))
        yield f"peak memory      {format_bytes(peak)} ({device}; counting {phases})"
        for item in data.get("memory", []):
            mark = " " if item.get("at_peak") else "-"
            yield (
                f"  {mark} {item['name']:<20} {format_bytes(item['bytes']):>10}  "
                f"{item['phase']:<10} {item['field']}"
            )
        if not all(item.get("at_peak") for item in data.get("memory", [])):
            yield "  (- : not counted in the peak: freed before it)"
    if "fused_loss" in data:  # a server older than the field does not send it
        yield (
            "loss             fused (the [tokens x vocabulary] logits are never held)"
            if data["fused_loss"]
            else "loss             unfused (the [tokens x vocabulary] logits are held)"
        )
    for note in data.get("notes", []):
        yield f"note: {note}"


def render_limits(data: dict[str, Any]) -> str:
    """One line for `Limits` given as JSON data (asdict, or the API's `limits`)."""

    def show(value: Any, fmt: Any) -> str:
        return "none" if not value else str(fmt(value))

    return (
        f"limits ({data.get('queue')} queue): "
        f"memory {show(data.get('max_memory_bytes'), format_bytes)}"
        f", parameters {show(data.get('max_params'), format_count)}"
        f", tokens/step {show(data.get('max_tokens_per_step'), format_count)}"
        f", total tokens {show(data.get('max_total_tokens'), format_count)}"
    )
