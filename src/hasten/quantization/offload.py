"""8-bit weights kept on disk with their row scales, and the hook that runs such a layer from disk.

The weight is written as int8 (``<layer>.weight.dat``) and its float32 scales as ``<layer>.SCB.dat`` in the
offload folder's index. The dispatch hooks bring the int8 weight back for each forward like any other
offloaded tensor; ``Int8OffloadHook`` hands bitsandbytes the matching scales before the forward and drops
the layer's cached copies afterwards, so nothing of an offloaded layer stays in memory between forwards.

4-bit layers are not offloaded: bitsandbytes keeps their quantization state (absmax, code book) in a Python
object on the parameter, which moving the parameter to the meta device between forwards destroys.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional, Union

import torch
import torch.nn as nn

from ..big_modeling.hooks import ForwardArguments, ModelHook, SequentialHook
from ..big_modeling.offload import offload_weight
from ..big_modeling.tensor_placement import set_module_tensor_to_device
from .backend import import_bnb

__all__ = ["quantize_and_offload_8bit", "Int8OffloadHook", "attach_int8_offload_hooks"]


def quantize_and_offload_8bit(model: nn.Module, param: torch.Tensor, param_name: str, new_dtype: Optional[torch.dtype],
                              offload_folder: Union[str, os.PathLike], offload_index: dict[str, dict],
                              fp16_statistics: Optional[torch.Tensor]) -> dict[str, dict]:
    """Write the 8-bit weight ``param_name`` and its scales to ``offload_folder`` (recorded in ``offload_index``)
    and leave an empty int8 parameter on the meta device in ``model``.

    ``param`` is a float weight (quantized here, on the CPU) when ``fp16_statistics`` is None, else an int8
    weight whose scales are ``fp16_statistics``. ``new_dtype`` is accepted for Accelerate's signature.
    """
    if fp16_statistics is None:
        bnb = import_bnb()
        quantized, scales, _ = bnb.functional.int8_vectorwise_quant(param.detach().to("cpu", torch.float16))
    else:
        quantized, scales = param.detach(), fp16_statistics
    offload_weight(quantized, param_name, offload_folder, index=offload_index)
    offload_weight(scales.to(torch.float32), param_name.replace("weight", "SCB"), offload_folder, index=offload_index)
    set_module_tensor_to_device(model, param_name, "meta", dtype=torch.int8)
    return offload_index


class Int8OffloadHook(ModelHook):
    """Runs after the weight-loading hook of an offloaded ``Linear8bitLt``: gives bitsandbytes the layer's
    scales (read from ``scales_map[scales_name]``) for the forward, and forgets them and its int8 copy after."""

    def __init__(self, scales_map: Mapping[str, torch.Tensor], scales_name: str = "SCB"):
        self.scales_map = scales_map
        self.scales_name = scales_name

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> ForwardArguments:
        weight = module.weight
        weight.CB = weight.data
        weight.SCB = self.scales_map[self.scales_name].to(weight.device)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.state.CB = module.state.SCB = None
        module.weight.CB = module.weight.SCB = None
        return output


def attach_int8_offload_hooks(model: nn.Module, layer_names: list[str]) -> None:
    """Chain an ``Int8OffloadHook`` after the dispatch hook of every offloaded 8-bit layer in ``layer_names``;
    the scales come from that hook's own weights map (the offload folder or the CPU state dict)."""
    for name in layer_names:
        layer = model.get_submodule(name)
        hook = getattr(layer, "_hf_hook", None)
        align = next((h for h in getattr(hook, "hooks", [hook]) if getattr(h, "weights_map", None) is not None), None)
        if align is None or not align.offload:
            continue
        # set directly (not add_hook_to_module(append=True), which detaches the first hook and reloads the weight)
        layer._hf_hook = SequentialHook(hook, Int8OffloadHook(align.weights_map))
