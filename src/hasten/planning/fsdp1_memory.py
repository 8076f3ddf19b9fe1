"""The memory of training steps per rank under FSDP1 (``FullyShardedDataParallel``), at any number of processes,
predicted on one.

``fsdp1_step_memory`` wraps the model as ``FSDP1Strategy.shard_model`` does (the plugin's units and the wrapper's
options from ``strategies/fsdp/fsdp1.wrapper_options``; activation checkpointing of each unit after wrapping) on
fake tensors over PyTorch's fake process group of ``world_size`` ranks, and runs training steps under PyTorch's
``MemTracker``: FSDP1's own flat parameters, its gathers (straight into the flat parameter), its backward prefetch as
the plugin asks, and the flat gradient it reduce-scatters are what is counted, not a model of them.

Two differences from the run, neither changing a byte: the trace flattens without ``use_orig_params`` (the tracker
cannot follow the parameter views that option makes; the flat parameters, their gradients and the optimizer state
hold the same bytes either way), and it neither syncs the weights from rank 0 nor initialises modules on meta.
``MemTracker`` counts a unit's gathered flat parameter as a parameter: what is above this rank's shards is reported
as ``gathered_parameters``.
"""
from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import replace
from typing import Any, Callable

import torch
from torch import nn

from .sharded_memory import fake_process_group
from .step_memory import MemoryBreakdown, check_step_arguments, run_steps
from .torch_tools import memory_tracker

__all__ = ["fsdp1_step_memory"]


def _shard_bytes(model: nn.Module) -> int:
    """Bytes of this rank's shards of the flat parameters (read while they are sharded)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _gathered_apart(memory: MemoryBreakdown, shards: int) -> MemoryBreakdown:
    """``memory`` with what its parameters hold above this rank's ``shards`` moved to ``gathered_parameters``."""
    gathered = max(0, memory.parameters - shards)
    return replace(memory, parameters=memory.parameters - gathered,
                   gathered_parameters=memory.gathered_parameters + gathered)


def fsdp1_step_memory(build_model: Callable[[], nn.Module], make_batch: Callable[[], Any], *, world_size: int,
                      fsdp_plugin: Any, optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW,
                      mixed_precision: str = "no", steps: int = 3, micro_batches: int = 1, fake: bool = True
                      ) -> dict[str, MemoryBreakdown]:
    """Rank 0's peak of each phase (``run_steps``) of ``steps`` training steps of the model wrapped in FSDP1 over
    ``world_size`` ranks as ``fsdp_plugin`` (an ``fsdp_version=1`` ``FullyShardedDataParallelPlugin``; not changed)
    says. ``fake=False``: on real tensors over the process group this process has (of ``world_size`` ranks), a
    measurement. The other arguments are ``training_step_memory``'s."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.fsdp import FullyShardedDataParallel

    from ..strategies.fsdp.fsdp1 import wrapper_options
    from ..strategies.fsdp.fsdp2 import gather_in_run_precision
    from ..strategies.fsdp.wrapping import apply_activation_checkpointing, wrap_policy, wrap_units

    check_step_arguments(mixed_precision, steps)
    plugin = copy.copy(fsdp_plugin)
    gather_in_run_precision(plugin, mixed_precision)  # what the strategy does with the run's precision
    if not fake and (not dist.is_initialized() or dist.get_world_size() != world_size):
        raise ValueError(f"fsdp1_step_memory(fake=False) measures in a process group of {world_size} processes; this "
                         "process has none of that size.")
    group = fake_process_group(world_size) if fake else contextlib.nullcontext()
    with group, FakeTensorMode() if fake else contextlib.nullcontext(), warnings.catch_warnings():
        # FSDP1 compares storage pointers, which a fake tensor warns about and answers consistently
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        model = build_model()
        decide = wrap_policy(model, plugin)
        units = wrap_units(model, decide)
        options = wrapper_options(plugin, decide, torch.device("cpu"))
        options.update(use_orig_params=False, sync_module_states=False, param_init_fn=None)  # see the docstring
        wrapped = FullyShardedDataParallel(model, **options)
        if plugin.activation_checkpointing:
            apply_activation_checkpointing(wrapped, units)
        shards = _shard_bytes(wrapped)
        optim = optimizer(wrapped.parameters())
        tracker = memory_tracker()
        tracker.track_external(wrapped, optim)
        phases = run_steps(wrapped, optim, tracker, make_batch, mixed_precision=mixed_precision, steps=steps,
                           micro_batches=micro_batches)
    return {phase: _gathered_apart(memory, shards) for phase, memory in phases.items()}
