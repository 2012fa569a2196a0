"""Validated value types shared by every config model: finite numbers, clean strings.

Kept apart from `core.config`'s `__init__` so that the sections in other modules
(`core.config.graders`, `.model`, `.task`) can use them without an import cycle.
"""

from __future__ import annotations

import math
import unicodedata
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError


def _finite(value: Any, handler: ValidatorFunctionWrapHandler) -> float:
    """NaN and infinity pass `gt`/`le` checks in surprising ways (NaN fails `le` with a misleading
    message, inf passes `ge=0` and serializes as null); refuse them first, with a clear message.
    An int too large for a double is refused the same way."""
    if isinstance(value, float) and not math.isfinite(value):
        shown = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        raise PydanticCustomError("finite_number", "must be finite (got {value})", {"value": shown})
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            raise PydanticCustomError(
                "finite_number", "must be finite (got an integer too large for a float)"
            ) from None
    result: float = handler(value)
    return result


FINITE = WrapValidator(_finite)
"""The finiteness check alone, for bounds inside an Optional: `Annotated[float, Field(gt=0),
FINITE] | None` (bounds first, so that the JSON schema shows them as minimum/maximum)."""

FiniteFloat = Annotated[float, FINITE]
"""A float that is never NaN or infinite (an int is accepted and becomes a float)."""


def no_control_chars(value: str, what: str = "") -> str:
    """Control characters (C0 incl. NUL, tab and newlines, DEL, C1) have no business in a name or
    a path: they forge log lines, truncate C strings and make file names unreadable."""
    for i, char in enumerate(value):
        if unicodedata.category(char) == "Cc":
            raise PydanticCustomError(
                "control_character",
                "{what}must not contain control characters (found {char} at position {pos})",
                {"what": what, "char": f"U+{ord(char):04X}", "pos": i},
            )
    return value


NO_CONTROL_CHARS = AfterValidator(no_control_chars)
"""The control-character check alone, for a length limit inside an Optional: `Annotated[str,
Field(max_length=9), NO_CONTROL_CHARS] | None` (limit first, or its message speaks of "items")."""

CleanStr = Annotated[str, NO_CONTROL_CHARS]
"""A string without control characters."""


class Strict(BaseModel):
    """Every config section's base: no extra keys, no coercion (`core.config`'s docstring)."""

    # allow_inf_nan=False also guards float fields that are not declared FiniteFloat
    model_config = ConfigDict(extra="forbid", frozen=False, strict=True, allow_inf_nan=False)
