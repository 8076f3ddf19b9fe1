"""Accelerate's ``accelerate.utils.bnb`` names; the implementation lives in ``hasten.quantization``.

bitsandbytes is imported only when a model is quantized: the questions about a model (``has_4bit_bnb_layers``,
``get_keys_to_not_convert``, ``get_parameter_device``) work without it.
"""
from __future__ import annotations

import torch.nn as nn

from ..quantization.backend import loaded_bnb
from ..quantization.load import get_quantized_model_device_map, load_and_quantize_model
from ..quantization.offload import quantize_and_offload_8bit
from ..quantization.replace import replace_with_bnb_layers
from ..quantization.skip import get_keys_to_not_convert

__all__ = [
    "load_and_quantize_model", "get_quantized_model_device_map", "replace_with_bnb_layers",
    "get_keys_to_not_convert", "has_4bit_bnb_layers", "get_parameter_device", "quantize_and_offload_8bit",
]


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds bitsandbytes ``Linear4bit`` layers."""
    bnb = loaded_bnb()
    if bnb is None:  # never imported, so no such layer can exist
        return False
    return any(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())


def get_parameter_device(parameter: nn.Module):
    """The device of the first parameter of ``parameter`` (a module)."""
    return next(parameter.parameters()).device
