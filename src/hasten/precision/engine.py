"""The engine-owned family: a backend whose engine keeps 16-bit weights and scales losses itself (DeepSpeed).

No autocast and no scaler on hasten's side; only float32 inputs are cast to the weights' dtype, and outputs come
back as float32, as the autocast family returns them.
"""
from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, ContextManager, Optional

import torch
from torch import nn

from ..collectives.operations import convert_to_fp32
from .base import Precision

if TYPE_CHECKING:
    from ..config.fp8 import AORecipeKwargs
    from ..config.kwargs import AutocastKwargs

__all__ = ["EnginePrecision"]


class _CastInputsForward:
    """A forward that casts float32 tensor inputs to the engine's 16-bit dtype and returns fp32 outputs (the
    engine's weights are 16-bit; DeepSpeed itself casts only fp16 inputs, and only with ``auto_cast``)."""

    def __init__(self, forward, dtype: torch.dtype):
        self.forward = forward
        self.dtype = dtype
        functools.update_wrapper(self, forward)

    def _cast(self, value):
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
            return value.to(self.dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast(v) for v in value)
        if isinstance(value, dict):
            return {k: self._cast(v) for k, v in value.items()}
        return value

    def __call__(self, *args, **kwargs):
        return convert_to_fp32(self.forward(*self._cast(args), **self._cast(kwargs)))


class EnginePrecision(Precision):
    """Mixed precision under DeepSpeed: the engine holds 16-bit weights with fp32 master copies and scales fp16
    losses itself, so there is no autocast and no scaler here; only inputs are cast to the weights' dtype.

    ``"fp8"``: a bf16 engine whose linear layers (those the run's ``AORecipeKwargs`` chooses, ``fp8.py``) are
    torchao's ``Float8Linear``, converted before the engine is built, with plain weights the engine can flatten.
    ``device`` and ``fp8_recipe`` are read for fp8 only.
    """

    def __init__(self, mode: str, device: Optional[torch.device] = None, fp8_recipe: Optional[AORecipeKwargs] = None):
        self.mode = mode
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}.get(mode)
        self.recipe = None
        if mode == "fp8":
            from ..config.fp8 import FP8BackendType
            from .fp8 import fp8_recipe as checked_recipe

            self.recipe = checked_recipe(device if device is not None else torch.device("cpu"), fp8_recipe)
            self.fp8_backend = FP8BackendType.AO

    def autocast(self, autocast_handler: Optional[AutocastKwargs] = None) -> ContextManager[None]:
        return contextlib.nullcontext()

    def wrap_forward(self, model: nn.Module) -> nn.Module:
        if self.recipe is not None:
            from .fp8 import convert_with_recipe

            model = convert_with_recipe(model, self.recipe, fsdp_all_gather=False)
        if self.dtype is None or isinstance(model.__dict__.get("forward"), _CastInputsForward):
            return model
        model._original_forward = model.forward
        model.forward = _CastInputsForward(model.forward, self.dtype)
        return model
