"""The autocast family of precisions: torch's autocast, and the fp16 loss scaler (``MixedPrecision``).

Also Accelerate's two functions ``get_grad_scaler`` and ``get_mixed_precision_context_manager``, which follow the
process state: the device is ``PartialState().device`` once a state exists (so ``cpu=True`` on a GPU machine gives
CPU autocast and a CPU scaler), else CUDA when available, else CPU.
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ContextManager, Optional, Union

import torch

from ..collectives.operations import convert_to_fp32
from ..config.enums import DistributedType
from .base import Precision

if TYPE_CHECKING:
    from ..config.kwargs import AutocastKwargs, GradScalerKwargs

__all__ = ["get_grad_scaler", "get_mixed_precision_context_manager", "MixedPrecision"]

_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


def _device_type() -> str:
    """The device type the run computes on."""
    from ..state import PartialState

    if PartialState._shared_state:
        return PartialState().device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def get_grad_scaler(distributed_type: Optional[Union[DistributedType, str]] = None,
                    **kwargs: Any) -> torch.amp.GradScaler:
    """A ``torch.amp.GradScaler`` for the run's device (``ShardedGradScaler`` under FSDP).

    ``kwargs`` go to the scaler's constructor (``init_scale``, ``growth_interval``, ``enabled``, ``device`` ...).
    """
    kwargs.setdefault("device", _device_type())
    # Accelerate's signature names the backend; FSDP's sharded gradients need the sharded scaler
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


def get_mixed_precision_context_manager(native_amp: bool = False,
                                        autocast_kwargs: Optional[Union[AutocastKwargs, Mapping[str, Any]]] = None
                                        ) -> ContextManager[None]:
    """``torch.autocast`` for the run's device and mixed precision, or a ``nullcontext`` when ``native_amp`` is
    False (mixed precision off).

    The dtype follows ``AcceleratorState().mixed_precision`` once a state exists: ``fp16`` -> float16, ``bf16`` and
    ``fp8`` -> bfloat16; otherwise the device's autocast default. ``autocast_kwargs`` (dict or ``AutocastKwargs``)
    go to ``torch.autocast``.
    """
    options = _autocast_options(autocast_kwargs)
    if not native_amp:
        return contextlib.nullcontext()
    from ..state import AcceleratorState

    state = AcceleratorState.current()
    dtype = _AUTOCAST_DTYPES.get(state.mixed_precision) if state is not None else None
    if dtype is not None:
        options.setdefault("dtype", dtype)
    return torch.autocast(device_type=_device_type(), **options)


class _AutocastForward:
    """A model's forward run under autocast, with floating outputs converted back to fp32.

    Installed as the model's ``forward`` by ``MixedPrecision.wrap_forward``; the replaced forward is kept as
    ``model._original_forward`` (``unwrap_model(keep_fp32_wrapper=False)`` puts it back).
    """

    def __init__(self, forward, precision: "MixedPrecision"):
        self.forward = forward
        self.precision = precision
        functools.update_wrapper(self, forward)

    def __call__(self, *args, **kwargs):
        with self.precision.autocast():
            outputs = self.forward(*args, **kwargs)
        return convert_to_fp32(outputs)


class MixedPrecision(Precision):
    """Mixed precision through torch's autocast: the fp16 loss scaler, forwards wrapped in autocast.

    Parameters:
        mode: "no", "fp16" or "bf16" ("fp8": ``Float8Precision``, ``fp8.py``).
        device: the device the model computes on.
        scaler_kwargs: a ``GradScalerKwargs`` (fp16 only).
        autocast_kwargs: an ``AutocastKwargs`` applied to every autocast region.
        scaler_class: the fp16 loss scaler's class (a sharded backend's; ``torch.amp.GradScaler`` by default).
    """

    def __init__(self, mode: str, device: torch.device, scaler_kwargs: Optional[GradScalerKwargs] = None,
                 autocast_kwargs: Optional[AutocastKwargs] = None,
                 scaler_class: Optional[type[torch.amp.GradScaler]] = None):
        self.mode = mode
        self.device = device
        self.autocast_kwargs = autocast_kwargs
        self.scaler = None
        # built once: the forward wrapper enters autocast on every call
        self._autocast_options = _autocast_options(autocast_kwargs)
        self._autocast_options.setdefault("dtype", torch.float16 if mode == "fp16" else torch.bfloat16)
        #: the dtype autocast computes in (None: mixed precision off)
        self.autocast_dtype = self._autocast_options["dtype"] if self.native_amp else None
        if mode == "fp16":
            if device.type == "cpu":
                _warn_once("fp16 mixed precision on the CPU works but is much slower than bf16 (about 27x here); "
                           "use mixed_precision='bf16' on CPUs.")
            options = scaler_kwargs.to_kwargs() if scaler_kwargs is not None else {}
            options["device"] = device.type
            self.scaler = (scaler_class or torch.amp.GradScaler)(**options)

    @property
    def native_amp(self) -> bool:
        """Whether autocast is on (fp16, bf16, fp8's non-fp8 layers)."""
        return self.mode in ("fp16", "bf16", "fp8")

    def autocast(self, autocast_handler: Optional[AutocastKwargs] = None) -> ContextManager[None]:
        """The autocast context for this run (``autocast_handler`` overrides the run's AutocastKwargs): this
        precision's device and dtype, never the process-wide state's."""
        options = self._autocast_options if autocast_handler is None else \
            {"dtype": self._autocast_options["dtype"], **_autocast_options(autocast_handler)}
        if not self.native_amp:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, **options)

    def wrap_forward(self, model: torch.nn.Module) -> torch.nn.Module:
        """Make ``model.forward`` run under autocast and return fp32 outputs (no-op without mixed precision)."""
        if not self.native_amp or isinstance(model.__dict__.get("forward"), _AutocastForward):
            return model
        model._original_forward = model.forward
        model.forward = _AutocastForward(model.forward, self)
        return model


_WARNED: set = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=3)
