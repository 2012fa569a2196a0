"""FSDP2 (`train.sharding: fsdp`): each rank of a data-parallel run holds 1/N of the weights,
gradients and optimizer state instead of a whole replica (`core.parallel.distributed`).

`torch.distributed.fsdp.fully_shard` wraps each transformer block and the whole model: a
module's weights are gathered for its forward and backward and freed after, and gradients are
reduce-scattered, so each rank keeps the shard of the step it owns. What this trainer does
besides a training forward needs care, and this module holds it:

- **Sampling and evaluation run on gathered weights.** FSDP gathers in collectives, which every
  rank must enter together, but ranks sample different completions and stop at different
  lengths (and only rank 0 evaluates). So before a rollout or an evaluation every rank gathers
  every block once (`gathered`), and the forwards in between call no collective. With vLLM,
  every rank gathers the weights to load them into its engine.
- **Gradients are summed, not averaged.** Each rank's loss already carries the whole batch's
  denominator (`core.training.update`), so the ranks' gradients must be summed. FSDP averages (gloo
  cannot pre-multiply): `core.training.update` scales the loss by the world size instead.
- **Checkpoints are sharded** (`torch.distributed.checkpoint`): every rank writes its shard of
  the weights and optimizer state, and a checkpoint loads on any number of ranks, sharded or
  not, one process included.
- **The fused loss goes through the root.** It reads the output layer's weight outside any
  forward, after `forward_hidden`, which FSDP learns to treat as a forward of the whole model.
- **The final model is gathered** on rank 0 (full tensors on the CPU) and saved as always.

Not supported yet, refused by the config: separate rollout copies (staleness, a rollout
dtype), the KL reference (a second model), LoRA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from core.models.base import CausalLM

DCP_DIR = "dcp"  # a sharded checkpoint's weights and optimizer state, in a checkpoint folder


def shard(lm: CausalLM) -> None:
    """Shard `lm` over the default process group: each block, then the whole model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = "cuda" if lm.device.type == "cuda" else "cpu"
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    for block in lm.blocks():
        fully_shard(block, mesh=mesh)
    fully_shard(lm.module, mesh=mesh)
    if lm.output_projection() is not None and lm.hidden_skips_module:
        _hidden_through_the_root(lm)


def _hidden_through_the_root(lm: CausalLM) -> None:
    """The fused loss runs `forward_hidden`, which for a Hugging Face model calls the decoder,
    not the whole model: the root's FSDP hooks, which gather the weights outside the blocks
    (embeddings, final norm, output layer) and reduce their gradients after the backward,
    would never run. Registered as one of the root's forward methods, it runs them; the root
    keeps its weights gathered until its backward, so `output_projection` read after it holds
    the whole output layer. Not for a `forward_hidden` that calls the root itself: nested,
    the outer hook would reshard what the inner one leaves gathered."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    module = cast(Any, lm.module)
    module.pdppo_forward_hidden = lm.forward_hidden
    register_fsdp_forward_method(lm.module, "pdppo_forward_hidden")
    lm.forward_hidden = module.pdppo_forward_hidden  # type: ignore[method-assign]


def _fsdp_modules(lm: CausalLM) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in lm.module.modules() if isinstance(m, FSDPModule)]


def is_sharded(lm: CausalLM) -> bool:
    return bool(_fsdp_modules(lm))


@contextlib.contextmanager
def gathered(lm: CausalLM) -> Iterator[None]:
    """The whole model's weights on every rank until the `with` ends, and forwards that call no
    collective meanwhile (each rank may run as many as it likes). A collective itself: every
    rank enters it."""
    modules = _fsdp_modules(lm)
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in modules:
            m.reshard()
            # FSDP's defaults back: blocks free their weights after each forward, the root
            # keeps its own until the backward (the fused loss reads the output layer then)
            m.set_reshard_after_forward(m is not lm.module, recurse=False)


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """`clip_grad_norm_`'s total norm as a plain tensor (a DTensor over sharded gradients)."""
    full = getattr(norm, "full_tensor", None)
    return full() if full is not None else norm


def save_sharded(path: Path, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank writes its shard of the weights and optimizer state under `path`/dcp."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(module, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path / DCP_DIR))


def load_sharded(path: Path, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Weights and optimizer state from `path`/dcp, written by any number of ranks, into this
    run's (sharded over any number, or whole in one process)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(module, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path / DCP_DIR))
    set_state_dict(
        module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


def full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights as CPU tensors on rank 0 (empty on the others); a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return cast(dict[str, torch.Tensor], get_model_state_dict(module, options=options))
