"""``load_and_quantize_model``: a meta-device model plus a checkpoint in, a bitsandbytes-quantized model out.

The checkpoint is streamed one tensor at a time (a shard's float weights are never all in memory together):
each weight of a quantized layer is quantized as soon as it is read, every other tensor is cast to its dtype
and placed. The device map, dispatch, offload folder and checkpoint readers are those of ``hasten.big_modeling``;
this module only decides what each tensor becomes.
"""
from __future__ import annotations

import logging
import os
from typing import Optional, Union

import torch
import torch.nn as nn

from ..big_modeling.checkpoint_files import TorchFile
from ..big_modeling.device_checks import check_device_value
from ..big_modeling.device_map import check_device_map, device_of, infer_auto_device_map
from ..big_modeling.device_memory import accelerator_count, accelerator_type
from ..big_modeling.dispatch import dispatch_model
from ..big_modeling.offload import offload_weight, save_offload_index
from ..big_modeling.sizes import get_balanced_memory
from ..big_modeling.tensor_placement import as_device, set_module_tensor_to_device
from ..big_modeling.tied import find_tied_parameters, retie_parameters
from ..config.quantization import BnbQuantizationConfig
from ..core.allocator import release_free_heap
from .backend import import_bnb
from .checkpoint import plan_checkpoint, split_layer_key
from .offload import attach_int8_offload_hooks, quantize_and_offload_8bit
from .replace import quantized_layer_names, replace_with_bnb_layers, set_prequantized_weight, set_quantized_weight
from .sizes import quantized_special_dtypes
from .skip import matches_module, resolve_unquantized

__all__ = ["load_and_quantize_model", "get_quantized_model_device_map"]

logger = logging.getLogger(__name__)
_META = torch.device("meta")
_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def _default_device():
    """Where a quantized model goes without a device map: the first accelerator bitsandbytes runs on, else the CPU."""
    if accelerator_type() in ("cuda", "xpu") and accelerator_count() > 0:
        return 0
    return "cpu"


def get_quantized_model_device_map(model: nn.Module, bnb_quantization_config: BnbQuantizationConfig,
                                   device_map: Optional[Union[str, dict]] = None, max_memory: Optional[dict] = None,
                                   no_split_module_classes: Optional[list[str]] = None) -> dict:
    """The device map of ``model`` once quantized: ``None`` puts everything on the default device (the first GPU,
    else the CPU); a strategy (``"auto"``, ``"balanced"``, ``"balanced_low_0"``, ``"sequential"``) is planned with
    the quantized sizes (int8 / 4-bit weights, ``torch_dtype`` and fp32 for the rest); a dict is checked."""
    config = bnb_quantization_config
    if device_map is None:
        return {"": _default_device()}
    if isinstance(device_map, str):
        if device_map not in _STRATEGIES:
            raise ValueError(f"device_map={device_map!r} is not a strategy: use a dict or one of {', '.join(_STRATEGIES)}.")
        if no_split_module_classes is None:
            no_split_module_classes = list(getattr(model, "_no_split_modules", None) or [])
        special = quantized_special_dtypes(model, config)
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split_module_classes,
                                             dtype=config.torch_dtype, special_dtypes=special,
                                             low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split_module_classes,
                                           dtype=config.torch_dtype, special_dtypes=special)
        return dict(device_map)
    if isinstance(device_map, dict):
        check_device_map(model, device_map)
        return dict(device_map)
    raise ValueError(f"device_map must be None, a dict or one of {', '.join(_STRATEGIES)}; got {device_map!r}.")


def _main_device(device_map: dict):
    return next((d for d in device_map.values() if d not in ("cpu", "disk")), "cpu")


def _check_offload(device_map: dict, layers: list, config, offload_folder) -> list:
    """The quantized layers that are offloaded (to disk, or to the CPU under an accelerator); refuse 4-bit ones."""
    offloaded_to = ("disk",) if _main_device(device_map) == "cpu" else ("cpu", "disk")
    offloaded = [name for name in layers if device_of(name, device_map) in offloaded_to]
    if offloaded and config.load_in_4bit:
        raise ValueError(
            f"The device map offloads the 4-bit layers {offloaded[:5]} to {'/'.join(offloaded_to)}: hasten offloads "
            "8-bit layers only, because bitsandbytes keeps a 4-bit weight's quantization state in a Python object "
            "that does not survive the move to the meta device between forwards. Give the main device more "
            "max_memory, or quantize with load_in_8bit=True.")
    if "disk" in device_map.values() and offload_folder is None:
        disk = [name for name, device in device_map.items() if device == "disk"]
        raise ValueError(f"The device map sends {disk} to 'disk': pass an offload_folder to keep their weights in.")
    return offloaded


def load_and_quantize_model(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: Union[str, os.PathLike, None] = None,
    device_map: Optional[Union[str, dict]] = None,
    no_split_module_classes: Optional[list[str]] = None,
    max_memory: Optional[dict] = None,
    offload_folder: Union[str, os.PathLike, None] = None,
    offload_state_dict: bool = False,
) -> nn.Module:
    """Quantize ``model``'s linear layers to 8 or 4 bits with bitsandbytes and load its weights.

    Either ``model`` is built under ``init_empty_weights`` and ``weights_location`` (a ``.safetensors`` / ``.bin``
    file, a sharded index ``.json`` or a folder holding one) gives its weights, which are quantized one tensor
    at a time as they are read; or ``model`` already holds its weights (no ``weights_location``) and is quantized
    where it is. Checkpoints saved from a quantized model (bitsandbytes' serialisation) are loaded as they are.

    ``device_map``: None (the first GPU, else the CPU), ``"auto"`` / ``"balanced"`` / ``"balanced_low_0"`` /
    ``"sequential"`` (planned with the quantized sizes within ``max_memory``, keeping ``no_split_module_classes``
    whole) or a dict. Modules mapped to ``"disk"`` go to ``offload_folder``; 8-bit layers are offloaded with
    their scales, 4-bit layers cannot be. ``offload_state_dict`` is accepted for Accelerate's signature: tensors
    are streamed one at a time, so there is no state dict to park on disk.

    Every check (configuration, model on meta, device map, offload folder, checkpoint keys and shapes) runs
    before anything is loaded or replaced.
    """
    if not isinstance(bnb_quantization_config, BnbQuantizationConfig):
        raise TypeError(f"bnb_quantization_config must be a BnbQuantizationConfig, got {type(bnb_quantization_config).__name__}.")
    if not isinstance(model, nn.Module):
        raise TypeError(f"load_and_quantize_model needs an nn.Module, got {type(model).__name__}.")
    import_bnb("load_and_quantize_model")
    config = bnb_quantization_config
    tensors = list(model.parameters()) + list(model.buffers())
    on_meta = [t.device == _META for t in tensors]
    if weights_location is None:
        if any(on_meta):
            raise ValueError("The model is (partly) on the meta device and no weights_location was given: pass the "
                             "checkpoint to load its weights from.")
        if device_map is not None:
            raise ValueError("device_map is used when loading from weights_location; a model that already holds its "
                             "weights is quantized where it is (dispatch it afterwards with dispatch_model).")
        replace_with_bnb_layers(model, config)
        _cast_unquantized(model, config, resolve_unquantized(model, config)[1])
        return model
    if not all(on_meta):
        raise ValueError("weights_location was given but the model already holds weights (it is not on the meta "
                         "device): build it under `with init_empty_weights(): model = ...` so that loading allocates "
                         "only the quantized weights, or quantize the loaded model without weights_location.")

    skip, keep = resolve_unquantized(model, config)
    layers = quantized_layer_names(model, skip + keep)
    device_map = get_quantized_model_device_map(model, config, device_map, max_memory, no_split_module_classes)
    for key, value in device_map.items():
        check_device_value(value, key)
    offloaded = _check_offload(device_map, layers, config, offload_folder)
    plan = plan_checkpoint(weights_location, model, set(layers), config)  # the replaced layers keep keys and shapes
    tied = find_tied_parameters(model)
    replace_with_bnb_layers(model, config, modules_to_not_convert=skip + keep)
    if offload_folder is not None:
        os.makedirs(offload_folder, exist_ok=True)

    offload_index: dict = {}
    pending: dict = {}  # already-quantized layer -> its tensors read so far
    layer_set = set(layers)
    for reader, wanted in zip(plan.readers, plan.wanted):
        for name, tensor in reader.tensors(wanted, mapped=lambda _: False):
            layer, rest = split_layer_key(name, layer_set)
            if layer in plan.prequantized and rest == "weight_format":
                continue  # always "row" in the bitsandbytes versions that write it
            if layer in plan.prequantized and rest != "bias":
                pending.setdefault(layer, {})[rest] = tensor
                if _complete(pending[layer], config, plan, layer):
                    _place_prequantized(model, layer, pending.pop(layer), device_map, offload_folder, offload_index)
            elif layer is not None and rest == "weight":
                _place_float_weight(model, layer, tensor, device_map, config, offload_folder, offload_index)
                del tensor
                release_free_heap()  # the float weight and bitsandbytes' temporaries
                continue
            else:
                _place_other(model, name, tensor, device_map, config, keep, offload_folder, offload_index)
            del tensor
        if isinstance(reader, TorchFile):
            reader.close()
        release_free_heap()
    if pending:
        raise ValueError(f"The checkpoint holds incomplete quantized weights for {sorted(pending)} (missing "
                         "their scales or quantization state).")
    if offload_index:
        save_offload_index(offload_index, offload_folder)
    retie_parameters(model, tied)
    return _dispatch(model, device_map, offloaded, offload_folder)


def _complete(parts: dict, config, plan, layer) -> bool:
    if "weight" not in parts:
        return False
    if config.load_in_8bit:
        return "SCB" in parts
    names = {name for header in plan.headers for name in header if name.startswith(f"{layer}.weight.")}
    return all(name[len(layer) + 1:] in parts for name in names)


def _target(name: str, device_map: dict):
    device = device_of(name, device_map)
    return device, (device if device == "disk" else as_device(device))


def _place_float_weight(model, layer, tensor, device_map, config, offload_folder, offload_index) -> None:
    module = model.get_submodule(layer)
    device, target = _target(f"{layer}.weight", device_map)
    if device == "disk":
        quantize_and_offload_8bit(model, tensor, f"{layer}.weight", torch.int8, offload_folder, offload_index, None)
        return
    set_quantized_weight(module, tensor, target, config)


def _place_prequantized(model, layer, parts, device_map, offload_folder, offload_index) -> None:
    module = model.get_submodule(layer)
    device, target = _target(f"{layer}.weight", device_map)
    if device == "disk":  # only 8-bit layers reach here (4-bit offload is refused before loading)
        quantize_and_offload_8bit(model, parts["weight"], f"{layer}.weight", torch.int8, offload_folder,
                                  offload_index, parts["SCB"])
        return
    extras = {key: value for key, value in parts.items() if key not in ("weight", "weight_format")}
    set_prequantized_weight(module, parts["weight"], extras, target)


def _dtype_for(name: str, tensor: torch.Tensor, config, keep) -> Optional[torch.dtype]:
    if not tensor.is_floating_point():
        return None
    return torch.float32 if matches_module(name, keep) else config.torch_dtype


def _place_other(model, name, tensor, device_map, config, keep, offload_folder, offload_index) -> None:
    dtype = _dtype_for(name, tensor, config, keep)
    device, target = _target(name, device_map)
    if device == "disk":
        stored = tensor.to(dtype) if dtype is not None else tensor
        set_module_tensor_to_device(model, name, "meta", dtype=stored.dtype)
        offload_weight(stored, name, offload_folder, index=offload_index)
        return
    set_module_tensor_to_device(model, name, target, value=tensor, dtype=dtype, clear_cache=False)


def _cast_unquantized(model, config, keep) -> None:
    """The tensors quantization left alone, in ``torch_dtype`` (fp32 in keep-in-fp32 modules)."""
    bnb = import_bnb()
    for module_name, module in model.named_modules():
        for kind in ("_parameters", "_buffers"):
            for leaf, tensor in list(getattr(module, kind).items()):
                if tensor is None or not tensor.is_floating_point():
                    continue
                if kind == "_parameters" and isinstance(tensor, (bnb.nn.Int8Params, bnb.nn.Params4bit)):
                    continue
                name = f"{module_name}.{leaf}" if module_name else leaf
                dtype = torch.float32 if matches_module(name, keep) else config.torch_dtype
                if tensor.dtype != dtype:
                    set_module_tensor_to_device(model, name, tensor.device, value=tensor.detach(), dtype=dtype)


def _dispatch(model, device_map: dict, offloaded: list, offload_folder) -> nn.Module:
    devices = set(device_map.values())
    if len(devices) == 1 and "disk" not in devices:
        model.hf_device_map = dict(device_map)
        return model
    dispatch_model(model, device_map=device_map, offload_dir=offload_folder)
    attach_int8_offload_hooks(model, offloaded)
    return model
