"""What a piece of code allocates, seen from inside torch's dispatcher: for tests of the memory
bounds that chunked passes promise (no tensor larger than a chunk), which CPU memory counters
cannot show for allocations this small."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class Allocations(TorchDispatchMode):
    """While active: the most elements of any tensor an operation returns (views included) and
    the sizes of the uninitialised buffers made (`torch.empty`, the scratch of chunked passes)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.empties: list[int] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        if func is torch.ops.aten.empty.memory_format:
            self.empties.append(out.numel())
        return out
