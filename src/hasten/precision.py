"""Mixed precision: the gradient scaler and the autocast context for the run's device and precision.

Both follow the process state: the device is ``PartialState().device`` once a state exists (so
``cpu=True`` on a GPU machine gives CPU autocast and a CPU scaler), else CUDA when available, else CPU.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch

from .config.enums import DistributedType

__all__ = ["get_grad_scaler", "get_mixed_precision_context_manager"]

# Distributed types whose engines run their own bf16 / fp8 casting: autocast keeps the device default there.
_OWN_LOW_PRECISION = (DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM)


def _device_type() -> str:
    """The device type the run computes on."""
    from .state import PartialState

    if PartialState._shared_state:
        return PartialState().device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def get_grad_scaler(distributed_type=None, **kwargs):
    """A ``torch.amp.GradScaler`` for the run's device (``ShardedGradScaler`` under FSDP).

    ``kwargs`` go to the scaler's constructor (``init_scale``, ``growth_interval``, ``enabled``, ``device`` ...).
    """
    kwargs.setdefault("device", _device_type())
    if distributed_type is not None and DistributedType.parse(distributed_type, "distributed_type") == \
            DistributedType.FSDP:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(**kwargs)
    return torch.amp.GradScaler(**kwargs)


def _autocast_options(autocast_kwargs) -> dict:
    if autocast_kwargs is None:
        return {}
    if hasattr(autocast_kwargs, "to_kwargs"):  # an AutocastKwargs handler
        return dict(autocast_kwargs.to_kwargs())
    if isinstance(autocast_kwargs, Mapping):
        return dict(autocast_kwargs)
    raise TypeError(
        f"autocast_kwargs must be None, a dict or an AutocastKwargs, got {type(autocast_kwargs).__name__}."
    )


def get_mixed_precision_context_manager(native_amp: bool = False, autocast_kwargs=None):
    """``torch.autocast`` for the run's device and mixed precision, or a ``nullcontext`` when ``native_amp`` is
    False (mixed precision off).

    The dtype comes from ``AcceleratorState().mixed_precision`` when that state exists: ``fp16`` -> float16,
    ``bf16`` and ``fp8`` -> bfloat16 (except under DeepSpeed / Megatron-LM, which cast themselves); otherwise the
    device's autocast default. ``autocast_kwargs`` (dict or ``AutocastKwargs``) go to ``torch.autocast``.
    """
    options = _autocast_options(autocast_kwargs)
    if not native_amp:
        return contextlib.nullcontext()
    from .state import AcceleratorState

    dtype = None
    if AcceleratorState._shared_state:
        state = AcceleratorState()
        if state.mixed_precision == "fp16":
            dtype = torch.float16
        elif state.mixed_precision in ("bf16", "fp8") and state.distributed_type not in _OWN_LOW_PRECISION:
            dtype = torch.bfloat16
    if dtype is not None:
        options.setdefault("dtype", dtype)
    return torch.autocast(device_type=_device_type(), **options)
