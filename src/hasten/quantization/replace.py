"""Swapping ``nn.Linear`` layers for bitsandbytes layers, and putting (quantized) weights into them.

A layer is replaced on the meta device, so replacing costs no memory; its weight is then set from a float tensor
(quantized on the way to its device) or from an already-quantized one (bitsandbytes' serialisation: an int8
weight plus its ``SCB`` row scales, or a packed 4-bit weight plus its ``weight.*`` quantization state).
"""
from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn as nn

from .backend import import_bnb, is_bnb_layer
from ..core.aliases import Device
from .skip import matches_module, resolve_unquantized

if TYPE_CHECKING:
    from ..config.quantization import BnbQuantizationConfig

__all__ = ["replace_with_bnb_layers", "quantized_layer_names", "set_quantized_weight", "set_prequantized_weight"]

_META = torch.device("meta")


def _is_plain_linear(module) -> bool:
    return isinstance(module, nn.Linear) and not is_bnb_layer(module)


def quantized_layer_names(model: nn.Module, modules_to_not_convert: Collection[str]) -> list[str]:
    """Paths of the ``nn.Linear`` layers of ``model`` that quantization replaces (the root module is never)."""
    return [name for name, module in model.named_modules()
            if name and _is_plain_linear(module) and not matches_module(name, modules_to_not_convert)]


def _empty_bnb_layer(linear: nn.Linear, config) -> nn.Module:
    bnb = import_bnb()
    has_bias = linear.bias is not None
    if config.load_in_8bit:
        layer = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=has_bias, has_fp16_weights=False,
                                    threshold=config.llm_int8_threshold, device=_META)
    else:
        layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=has_bias,
                                  compute_dtype=config.bnb_4bit_compute_dtype,
                                  compress_statistics=config.bnb_4bit_use_double_quant,
                                  quant_type=config.bnb_4bit_quant_type, device=_META)
    layer.weight.requires_grad_(False)
    layer.source_cls = type(linear)
    layer.train(linear.training)
    return layer


def replace_with_bnb_layers(model: nn.Module, bnb_quantization_config: BnbQuantizationConfig,
                            modules_to_not_convert: Optional[list] = None,
                            current_key_name: Optional[list[str]] = None) -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` (except ``modules_to_not_convert``; default: the config's
    skip and keep-in-fp32 modules) by bitsandbytes layers, in place; the model is also returned.

    Layers of a model on the meta device are replaced empty (load their weights afterwards); the weights of a
    materialised layer are quantized on the layer's device. ``current_key_name`` is accepted for Accelerate's
    signature (a prefix of the names, unused: names are always taken from ``model``).
    """
    if modules_to_not_convert is None:
        skip, keep = resolve_unquantized(model, bnb_quantization_config)
        modules_to_not_convert = skip + keep
    for name in quantized_layer_names(model, modules_to_not_convert):
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = getattr(parent, leaf)
        layer = _empty_bnb_layer(linear, bnb_quantization_config)
        if linear.weight.device != _META:
            device = linear.weight.device
            set_quantized_weight(layer, linear.weight.detach(), device, bnb_quantization_config)
            if linear.bias is not None:
                layer.bias = nn.Parameter(linear.bias.detach().to(device, bnb_quantization_config.torch_dtype),
                                          requires_grad=linear.bias.requires_grad)
        setattr(parent, leaf, layer)
    return model


def set_quantized_weight(layer: nn.Module, value: torch.Tensor, device: Device, config: BnbQuantizationConfig) -> None:
    """Quantize the float ``value`` into ``layer.weight`` on ``device`` (bitsandbytes quantizes on the move)."""
    bnb = import_bnb()
    value = value.to(config.torch_dtype)
    if isinstance(layer, bnb.nn.Linear8bitLt):
        param = bnb.nn.Int8Params(value, requires_grad=False, has_fp16_weights=False)
    else:
        old = layer.weight
        param = bnb.nn.Params4bit(value, requires_grad=False, blocksize=old.blocksize,
                                  compress_statistics=old.compress_statistics, quant_type=old.quant_type,
                                  quant_storage=old.quant_storage, module=layer)
    layer._parameters["weight"] = param.to(device)


def set_prequantized_weight(layer: nn.Module, value: torch.Tensor, extras: dict[str, torch.Tensor],
                            device: Device) -> None:
    """Put an already-quantized weight into ``layer``: ``extras`` are its statistics keyed as in the layer's own
    state dict (``"SCB"`` for 8-bit, ``"weight.absmax"`` ... for 4-bit). Nothing is quantized again."""
    bnb = import_bnb()
    if isinstance(layer, bnb.nn.Linear8bitLt):
        param = bnb.nn.Int8Params(value, requires_grad=False, has_fp16_weights=False)
        param.SCB = extras["SCB"]
        param = param.to(device)
        param.SCB = extras["SCB"].to(device)  # Int8Params.to moves SCB only from a non-meta device
    else:
        stats = {key[len("weight."):]: tensor for key, tensor in extras.items() if key.startswith("weight.")}
        param = bnb.nn.Params4bit.from_prequantized(value, stats, requires_grad=False, device=device, module=layer)
    layer._parameters["weight"] = param
