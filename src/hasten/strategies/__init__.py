"""Training backends, one file each, behind the protocol in ``base.py``."""
from __future__ import annotations

from ..config.enums import DistributedType
from ..utils.planned import not_yet_supported
from .base import Strategy
from .ddp import DDPStrategy
from .single import SingleDeviceStrategy

__all__ = ["Strategy", "SingleDeviceStrategy", "DDPStrategy", "select_strategy"]

_NOT_YET = {
    "deepspeed_plugin": "DeepSpeed",
    "fsdp_plugin": "FSDP",
    "megatron_lm_plugin": "Megatron-LM",
    "torch_tp_plugin": "tensor parallelism",
}


def select_strategy(state, kwargs_handlers=None, **plugins) -> Strategy:
    """The strategy for this run: from the plugins given, else from the process state."""
    for name, label in _NOT_YET.items():
        if plugins.get(name) is not None:
            raise not_yet_supported(
                f"{label} ({name}=...)", "remove the plugin to train with DDP (several processes) or on a single device"
            )
    if state.distributed_type == DistributedType.NO:
        return SingleDeviceStrategy(state, kwargs_handlers)
    return DDPStrategy(state, kwargs_handlers)
