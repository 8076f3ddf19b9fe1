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

__all__ = ["fsdp2_step_memory", "fake_process_group"]


@contextlib.contextmanager
def fake_process_group(world_size: int):
    """PyTorch's fake process group of ``world_size`` ranks (this process is rank 0) as the default group (refused in
    a process that has a group already)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("Planning sharded layouts runs a fake process group of its own, and this process "
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
                      micro_batches: int = 1, replicas: int = 1,
                      by_phase: bool = False) -> Union[MemoryBreakdown, dict[str, MemoryBreakdown]]:
    """Rank 0's peak memory of ``steps`` training steps with the model sharded by FSDP2 over ``world_size`` ranks
    (the ranks of a full shard hold the same amounts). ``fsdp_plugin``: a ``FullyShardedDataParallelPlugin`` (its
    wrap policy, ``reshard_after_forward``, mixed precision policy, ``activation_checkpointing`` of each unit);
    default: the plugin ``prepare()`` uses without one. ``replicas`` > 1: HSDP, the shard group replicated that many
    times (a mesh of ``replicas`` x ``world_size``, the gradients reduced across the replicas as well). The other
    arguments are ``training_step_memory``'s."""
    from torch.distributed.device_mesh import init_device_mesh

    from ..config.fsdp import FullyShardedDataParallelPlugin
    from ..strategies.fsdp.fsdp2 import gather_in_run_precision, shard_in_units

    check_step_arguments(mixed_precision, steps)
    for name, value in (("world_size", world_size), ("replicas", replicas)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive number of processes, got {value!r}.")
    plugin = fsdp_plugin if fsdp_plugin is not None else FullyShardedDataParallelPlugin(fsdp_version=2)
    gather_in_run_precision(plugin, mixed_precision)  # what FSDP2Strategy does with the run's precision
    group = fake_process_group(world_size * replicas) if fake else contextlib.nullcontext()
    tensors = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        tensors = FakeTensorMode()
    with group:
        # real tensors: the mesh's own collectives need values
        mesh = init_device_mesh("cpu", (world_size,)) if replicas == 1 else \
            init_device_mesh("cpu", (replicas, world_size), mesh_dim_names=("dp_replicate", "dp_shard"))
        with tensors:
            model = shard_in_units(build_model(), plugin, mesh=mesh, mixed_precision=mixed_precision,
                                   device=torch.device("cpu"), is_main_process=True, checkpoint_units=True)
            optim = optimizer(model.parameters(), **(optimizer_kwargs or {}))
            tracker = sharded_memory_tracker(model, optim)
            phases = run_steps(model, optim, tracker, make_batch, mixed_precision=mixed_precision, steps=steps,
                               loss=loss, micro_batches=micro_batches)
    return phases if by_phase else highest(phases)
