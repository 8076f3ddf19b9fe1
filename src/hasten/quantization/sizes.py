"""How many bytes a model takes once quantized by ``load_and_quantize_model``, from shapes only (meta models work),
and ``allocated_bytes``, what a loaded model's tensors really hold (to check the estimate against).

Two uses: planning a device map (``special_dtypes`` for ``infer_auto_device_map``: int8 / 4-bit weights, fp32 for
keep-in-fp32 modules, ``torch_dtype`` for the rest) and ``hasten estimate-memory --dtypes int8 int4``, which adds
the quantization statistics bitsandbytes keeps next to each weight:

* 8-bit: one float32 scale per output row (``SCB``);
* 4-bit: one float32 absmax per block of 64 weights, a 16-entry float32 code book per layer; with double
  quantization the absmax are stored in uint8 with one float32 absmax per 256 of them and a 256-entry code book.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional, Union

import torch
import torch.nn as nn

from ..big_modeling.sizes import compute_module_sizes
from .replace import quantized_layer_names
from .skip import matches_module, resolve_unquantized

if TYPE_CHECKING:
    from ..config.quantization import BnbQuantizationConfig

__all__ = ["quantized_special_dtypes", "quantization_overhead", "quantized_module_sizes", "allocated_bytes"]

_BLOCKSIZE = 64  # bitsandbytes' default 4-bit block size
_NESTED_BLOCKSIZE = 256


def _weight_dtype(config) -> torch.dtype:
    return torch.uint4 if config.load_in_4bit else torch.int8


def quantized_special_dtypes(model: nn.Module, config: BnbQuantizationConfig, layers: Optional[list[str]] = None,
                             keep: Optional[list[str]] = None) -> dict[str, torch.dtype]:
    """Tensor name -> the dtype it is stored in when ``model`` is loaded quantized (tensors not listed take
    ``config.torch_dtype``): the quantized weights, and the floating tensors of keep-in-fp32 modules."""
    if layers is None or keep is None:
        skip, keep = resolve_unquantized(model, config)
        layers = quantized_layer_names(model, skip + keep)
    special = {f"{name}.weight": _weight_dtype(config) for name in layers}
    if keep:
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if tensor.is_floating_point() and matches_module(name, keep):
                special[name] = torch.float32
    return special


def quantization_overhead(out_features: int, in_features: int, config: BnbQuantizationConfig) -> int:
    """Bytes of the statistics bitsandbytes keeps for one quantized ``out x in`` weight."""
    if config.load_in_8bit:
        return 4 * out_features
    blocks = math.ceil(out_features * in_features / _BLOCKSIZE)
    if not config.bnb_4bit_use_double_quant:
        return 4 * blocks + 4 * 16
    return blocks + 4 * math.ceil(blocks / _NESTED_BLOCKSIZE) + 4 * 256 + 4 * 16 + 4


def quantized_module_sizes(model: nn.Module, config: BnbQuantizationConfig) -> dict[str, Union[int, float]]:
    """``compute_module_sizes`` of ``model`` as ``load_and_quantize_model`` would store it (``""``: the total),
    statistics included."""
    skip, keep = resolve_unquantized(model, config)
    layers = quantized_layer_names(model, skip + keep)
    sizes = compute_module_sizes(model, dtype=config.torch_dtype,
                                 special_dtypes=quantized_special_dtypes(model, config, layers, keep))
    for name in layers:
        linear = model.get_submodule(name)
        extra = quantization_overhead(linear.out_features, linear.in_features, config)
        parts = name.split(".")
        for end in range(len(parts) + 1):
            sizes[".".join(parts[:end])] += extra
    return sizes


def allocated_bytes(model: nn.Module) -> int:
    """Bytes held by a loaded model's parameters and buffers, with the quantization statistics bitsandbytes keeps
    beside its 8-bit (``SCB``) and 4-bit (absmax, code book; nested ones with double quantization) weights."""
    from .backend import loaded_bnb

    total = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    bnb = loaded_bnb()
    if bnb is None:  # no bitsandbytes layer can exist
        return total
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear8bitLt):
            scales = module.weight.SCB if module.weight.SCB is not None else module.state.SCB
            total += scales.numel() * scales.element_size()
        elif isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            parts = [state.absmax, state.code]
            if state.nested:
                parts += [state.state2.absmax, state.state2.code, state.offset]
            total += sum(t.numel() * t.element_size() for t in parts)
    return total
