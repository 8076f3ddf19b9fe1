"""``fully_shard`` a model from a plugin's settings: what ``FSDP2Strategy.shard_model`` and ``fsdp2_prepare_model``
(also when it is given any object that looks like an Accelerator) both do.

Under mixed precision, FSDP2 needs one original dtype among each group's trainable parameters; models stored in
bf16 with fp32 norms (many transformers checkpoints) have two. Their trainable float parameters then become fp32
master weights (the mixed-precision policy still computes in the low precision). A model without mixed precision
keeps its dtypes, and a 4-bit (bitsandbytes ``Params4bit``) model is never cast: that would destroy its weights.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

import torch
from torch import nn

from .wrapping import ignored_parameters

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import OffloadPolicy

    from ...config.fsdp import FullyShardedDataParallelPlugin

__all__ = ["shard_with_plugin", "shard_options", "upcast_mixed_master_weights", "offload_policy"]


def upcast_mixed_master_weights(model: nn.Module, mixed_precision: Optional[str]) -> bool:
    """Make the trainable float parameters fp32 when mixed precision is on and their dtypes differ; whether it did."""
    if mixed_precision in (None, "no"):
        return False
    trainable = [p for p in model.parameters() if p.requires_grad and p.is_floating_point()]
    if len({p.dtype for p in trainable}) <= 1:
        return False
    if any(type(p).__name__ == "Params4bit" for p in model.parameters()):
        return False
    for parameter in trainable:
        if parameter.dtype != torch.float32:
            parameter.data = parameter.data.to(torch.float32)
    return True


def offload_policy(plugin: FullyShardedDataParallelPlugin) -> OffloadPolicy:
    """The plugin's FSDP2 offload policy (pinned memory only where a GPU can pin it)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    policy = getattr(plugin, "cpu_offload", None)
    if policy is None or policy is False:
        return OffloadPolicy()
    if isinstance(policy, CPUOffloadPolicy) and policy.pin_memory and not torch.cuda.is_available():
        return CPUOffloadPolicy(pin_memory=False)
    return policy


def shard_options(plugin: FullyShardedDataParallelPlugin, mesh: Optional[DeviceMesh]) -> dict[str, Any]:
    """``fully_shard``'s keywords from the plugin: the mesh, resharding, mixed precision and offload."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return dict(mesh=mesh, reshard_after_forward=plugin.reshard_after_forward,
                mp_policy=plugin.mixed_precision_policy or MixedPrecisionPolicy(), offload_policy=offload_policy(plugin))


def shard_with_plugin(model: nn.Module, plugin: FullyShardedDataParallelPlugin, units: Iterable[nn.Module], *,
                      mesh: Optional[DeviceMesh], mixed_precision: Optional[str], device: torch.device,
                      is_main_process: bool,
                      broadcast_weights: Optional[Callable[[nn.Module, dict, torch.device], None]] = None) -> nn.Module:
    """``fully_shard`` each of ``units`` (children first) and then ``model``, with the plugin's resharding, precision,
    offload and ignored modules; ``cpu_ram_efficient_loading``: only the main process's weights are kept, and
    ``broadcast_weights(model, full_state, device)`` hands the others their shards."""
    from torch.distributed.fsdp import fully_shard

    upcast_mixed_master_weights(model, mixed_precision)
    options = shard_options(plugin, mesh)
    ignored = ignored_parameters(model, plugin.ignored_modules)
    if ignored:
        options["ignored_params"] = ignored
    full = None
    if plugin.cpu_ram_efficient_loading and broadcast_weights is not None:
        full = model.state_dict() if is_main_process else {}
        if not is_main_process:
            model.to("meta")
    for unit in units:
        fully_shard(unit, **options)
    fully_shard(model, **options)
    if full is not None:
        broadcast_weights(model, full, device)
    return model
