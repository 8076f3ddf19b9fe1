"""Accelerate's ``accelerate.utils.bnb`` names. bitsandbytes quantization is planned, not built yet.

The questions about a model work without bitsandbytes (``has_4bit_bnb_layers``, ``get_keys_to_not_convert``,
``get_parameter_device``); quantizing raises ``NotYetSupportedError``. bitsandbytes is never imported: it
initialises the GPU on import, and a model can only hold its layers if the program imported it already.
"""
from __future__ import annotations

import os
import sys
from copy import deepcopy
from typing import Optional, Union

import torch
import torch.nn as nn

from ..config.quantization import BnbQuantizationConfig
from .planned import not_yet_supported

__all__ = [
    "load_and_quantize_model", "get_quantized_model_device_map", "replace_with_bnb_layers",
    "get_keys_to_not_convert", "has_4bit_bnb_layers", "get_parameter_device", "quantize_and_offload_8bit",
]

_MEANWHILE = "load the model unquantized, or quantize it with bitsandbytes directly"


def _bnb(what: str):
    return not_yet_supported(f"bitsandbytes quantization ({what})", _MEANWHILE)


def load_and_quantize_model(
    model: torch.nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: Union[str, os.PathLike, None] = None,
    device_map: Optional[dict[str, Union[int, str, torch.device]]] = None,
    no_split_module_classes: Optional[list[str]] = None,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
    offload_folder: Union[str, os.PathLike, None] = None,
    offload_state_dict: bool = False,
):
    """Quantize ``model`` to 8 or 4 bits with bitsandbytes and load its weights (planned)."""
    raise _bnb("load_and_quantize_model")


def get_quantized_model_device_map(model, bnb_quantization_config, device_map=None, max_memory=None,
                                   no_split_module_classes=None):
    raise _bnb("get_quantized_model_device_map")


def replace_with_bnb_layers(model, bnb_quantization_config, modules_to_not_convert=None, current_key_name=None):
    raise _bnb("replace_with_bnb_layers")


def get_keys_to_not_convert(model):
    """Names of the modules to keep in full precision: the tied weights and the last module (e.g. ``lm_head``).

    A base model (no head: ``model.base_model_prefix`` is not an attribute) without tied weights keeps nothing.
    """
    from ..big_modeling.init_context import init_empty_weights
    from ..big_modeling.tied import find_tied_parameters

    with init_empty_weights():
        tied_model = deepcopy(model)  # no memory: the copy's parameters are on the meta device
    tied_keys = sum(find_tied_parameters(tied_model), [])
    prefix = getattr(model, "base_model_prefix", None)
    is_base_model = prefix is not None and not hasattr(model, prefix)
    if not tied_keys and is_base_model:
        return []
    last_module = list(model.named_children())[-1][0]
    untouched = list(set(tied_keys)) + list({last_module} - set(tied_keys))
    names = []
    for name in untouched:
        for suffix in (".weight", ".bias"):
            name = name.replace(suffix, "")
        names.append(name)
    return names


def has_4bit_bnb_layers(model):
    """Whether ``model`` holds bitsandbytes ``Linear4bit`` layers."""
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None:  # never imported, so no such layer can exist
        return False
    return any(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())


def get_parameter_device(parameter: nn.Module):
    """The device of the first parameter of ``parameter`` (a module)."""
    return next(parameter.parameters()).device


def quantize_and_offload_8bit(model, param, param_name, new_dtype, offload_folder, offload_index, fp16_statistics):
    raise _bnb("quantize_and_offload_8bit")
