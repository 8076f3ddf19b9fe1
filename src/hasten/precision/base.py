"""The precision interface every family implements, answered here for full precision (fp32: nothing to do).

A strategy chooses its precision together with itself (``Strategy.create_precision``); the Accelerator and the
loop only ask this interface: the loss scaler (fp16), whether autocast is on and in which dtype, the autocast
context, how a model's forward is wrapped, how its weights read in a state dict, and which fp8 library trains
(``Accelerator.fp8_backend``).
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, ContextManager, Optional

from ..config.fp8 import FP8BackendType

if TYPE_CHECKING:
    from torch import nn

    from ..config.kwargs import AutocastKwargs

__all__ = ["Precision"]


class Precision:
    """Full precision: no autocast, no scaler, the model's forward untouched."""

    #: "no", "fp16", "bf16" or "fp8"
    mode: str = "no"
    #: the fp16 loss scaler (a ``torch.amp.GradScaler``), or None
    scaler = None
    #: the dtype autocast computes in (None: autocast off)
    autocast_dtype = None
    #: the library that runs fp8 layers
    fp8_backend: FP8BackendType = FP8BackendType.NO

    @property
    def native_amp(self) -> bool:
        """Whether torch's autocast is on."""
        return self.autocast_dtype is not None

    def autocast(self, autocast_handler: Optional[AutocastKwargs] = None) -> ContextManager[None]:
        """The context a forward pass runs in (``autocast_handler``: an ``AutocastKwargs`` for this block)."""
        return contextlib.nullcontext()

    def wrap_forward(self, model: nn.Module) -> nn.Module:
        """``model`` with its forward wrapped for this precision (returned as it is here)."""
        return model

    def plain_state_dict(self, state: dict) -> dict:
        """``state`` (a model's state dict) with plain tensors where this precision keeps weights in a wrapper
        tensor of its own (fp8's); returned as it is here."""
        return state
