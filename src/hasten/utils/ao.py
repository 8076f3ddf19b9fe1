"""Accelerate's ``accelerate.utils.ao`` names: fp8 training with torchao's ``Float8Linear``.

The layer filters and ``has_ao_layers`` work without torchao; ``convert_model_to_fp8_ao`` needs it (an
``ImportError`` naming the package otherwise) and imports it only when called.
"""
from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING, Callable, Optional

import torch

from ..core.imports import require_extra

if TYPE_CHECKING:
    from torchao.float8 import Float8LinearConfig

__all__ = ["find_first_last_linear_layers", "filter_linear_layers", "filter_first_and_last_linear_layers",
           "has_ao_layers", "convert_model_to_fp8_ao"]


def find_first_last_linear_layers(model: torch.nn.Module):
    """Names of the first and the last ``nn.Linear`` of ``model`` (``(None, None)`` when it has none).

    fp8 training keeps them in higher precision: quantizing them tends to make training unstable.
    """
    first, last = None, None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            first = name if first is None else first
            last = name
    return first, last


def filter_linear_layers(module, fqn: str, layers_to_filter: list[str]) -> bool:
    """Whether ``module`` (named ``fqn``) may be converted to fp8: not in ``layers_to_filter``, and, for a linear
    layer, both dimensions divisible by 16."""
    if isinstance(module, torch.nn.Linear) and (module.in_features % 16 or module.out_features % 16):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module, fqn: str) -> bool:
    """``filter_linear_layers`` that also keeps the first and last linear layers of ``module`` out."""
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, layers_to_filter=[first, last])


def has_ao_layers(model: torch.nn.Module):
    """Whether ``model`` holds torchao ``Float8Linear`` layers."""
    float8_linear = sys.modules.get("torchao.float8.float8_linear")
    if float8_linear is None:  # never imported, so no such layer can exist
        return False
    return any(isinstance(module, float8_linear.Float8Linear) for module in model.modules())


def convert_model_to_fp8_ao(model: torch.nn.Module, config: Optional["Float8LinearConfig"] = None,
                            module_filter_func: Optional[Callable] = None):
    """Convert ``model``'s linear layers to torchao's ``Float8Linear`` in place.

    config: a ``torchao.float8.Float8LinearConfig`` (default: torchao's). module_filter_func: ``(module, fqn) ->
    bool``, which layers to convert; default: every linear layer with dimensions divisible by 16 except the first
    and the last, which stay in higher precision for stability.
    """
    float8 = require_extra("torchao.float8", "fp8 training through torchao")
    if module_filter_func is None:
        first, last = find_first_last_linear_layers(model)
        module_filter_func = partial(filter_linear_layers, layers_to_filter=[first, last])
    float8.convert_to_float8_training(model, module_filter_fn=module_filter_func, config=config)
