"""The memory of training steps per rank under FSDP2, at any number of processes, predicted on one.

``fsdp2_step_memory`` shards the model exactly as ``prepare()`` does (hasten's own ``shard_in_units``: the plugin's
wrap units, then the root) over a mesh of ``world_size`` ranks and runs training steps under PyTorch's FSDP memory
tracker. With ``fake=True`` the process group is PyTorch's fake one (collectives return at once, nothing is sent)
and the tensors are fake, so one process predicts what each rank of a 64-process job holds: its parameter and
gradient shards, the parameters a unit gathers for its compute, the all-gather and reduce-scatter buffers, the
optimizer state of its shards and the activations of its micro-batch. With ``fake=False`` it runs inside a real
launched job (every rank calls it) and measures.

The fake group becomes this process's default group for the duration of the call, so the call refuses to run in a
process that already has one (plan before the Accelerator is created, or in a process of its own).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from .step_memory import MemoryBreakdown, check_step_arguments, default_loss, highest, run_steps
from .torch_tools import fake_store, sharded_memory_tracker

__all__ = ["fsdp2_step_memory"]


@contextlib.contextmanager
def _fake_process_group(world_size: int):
    """PyTorch's fake process group of ``world_size`` ranks (this process is rank 0) as the default group."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("fsdp2_step_memory(fake=True) runs a fake process group of its own, and this process "
                           "already has a process group: plan before the Accelerator is created, or in a separate "
                           "process.")
    dist.init_process_group("fake", rank=0, world_size=world_size, store=fake_store())
    try:
        yield
    finally:
        dist.destroy_process_group()


def fsdp2_step_memory(build_model: Callable[[], nn.Module], make_batch: Callable[[], Any], *, world_size: int,
                      fsdp_plugin: Any = None, optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW,
                      optimizer_kwargs: Optional[dict] = None, mixed_precision: str = "no", steps: int = 3,
                      fake: bool = True, loss: Callable[[Any], torch.Tensor] = default_loss,
                      micro_batches: int = 1,
                      by_phase: bool = False) -> Union[MemoryBreakdown, dict[str, MemoryBreakdown]]:
    """Rank 0's peak memory of ``steps`` training steps with the model sharded by FSDP2 over ``world_size`` ranks
    (the ranks of a full shard hold the same amounts). ``fsdp_plugin``: a ``FullyShardedDataParallelPlugin`` (its
    wrap policy, ``reshard_after_forward``, mixed precision policy, ``activation_checkpointing`` of each unit);
    default: the plugin ``prepare()`` uses without one. The other arguments are ``training_step_memory``'s."""
    from torch.distributed.device_mesh import init_device_mesh

    from ..config.fsdp import FullyShardedDataParallelPlugin
    from ..strategies.fsdp.fsdp2 import gather_in_run_precision, shard_in_units

    check_step_arguments(mixed_precision, steps)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive number of processes, got {world_size!r}.")
    plugin = fsdp_plugin if fsdp_plugin is not None else FullyShardedDataParallelPlugin(fsdp_version=2)
    gather_in_run_precision(plugin, mixed_precision)  # what FSDP2Strategy does with the run's precision
    group = _fake_process_group(world_size) if fake else contextlib.nullcontext()
    tensors = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        tensors = FakeTensorMode()
    with group:
        mesh = init_device_mesh("cpu", (world_size,))  # real tensors: the mesh's own collectives need values
        with tensors:
            model = shard_in_units(build_model(), plugin, mesh=mesh, mixed_precision=mixed_precision,
                                   device=torch.device("cpu"), is_main_process=True, checkpoint_units=True)
            optim = optimizer(model.parameters(), **(optimizer_kwargs or {}))
            tracker = sharded_memory_tracker(model, optim)
            phases = run_steps(model, optim, tracker, make_batch, mixed_precision=mixed_precision, steps=steps,
                               loss=loss, micro_batches=micro_batches)
    return phases if by_phase else highest(phases)
