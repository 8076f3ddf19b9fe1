"""Precision: one interface (``base.py``), one class per family, chosen by the strategy together with itself.

- ``MixedPrecision`` (``autocast.py``): torch's autocast and the fp16 loss scaler (single device, DDP, FSDP, TP);
- ``Float8Precision`` (``fp8.py``): fp8 linear layers through torchao, bf16 autocast for the rest;
- ``EnginePrecision`` (``engine.py``): an engine that casts and scales itself (DeepSpeed); inputs cast only.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .autocast import MixedPrecision, get_grad_scaler, get_mixed_precision_context_manager
from .base import Precision
from .engine import EnginePrecision

if TYPE_CHECKING:
    import torch

    from ..config.fp8 import AORecipeKwargs
    from ..config.kwargs import AutocastKwargs, GradScalerKwargs

__all__ = ["Precision", "MixedPrecision", "EnginePrecision", "autocast_precision", "get_grad_scaler",
           "get_mixed_precision_context_manager"]


def autocast_precision(mode: str, device: torch.device, scaler_kwargs: Optional[GradScalerKwargs] = None,
                       autocast_kwargs: Optional[AutocastKwargs] = None,
                       scaler_class: Optional[type[torch.amp.GradScaler]] = None,
                       fp8_recipe: Optional[AORecipeKwargs] = None) -> Precision:
    """The autocast family's precision for ``mode`` ("no", "fp16", "bf16"; "fp8" trains through torchao, with
    ``fp8_recipe``, the run's ``AORecipeKwargs`` if any)."""
    if mode == "fp8":
        from .fp8 import Float8Precision

        return Float8Precision(device, scaler_kwargs, autocast_kwargs, scaler_class, recipe=fp8_recipe)
    return MixedPrecision(mode, device, scaler_kwargs, autocast_kwargs, scaler_class)
