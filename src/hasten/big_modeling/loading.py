"""Filling a (usually empty, meta-device) model from a checkpoint, tensor by tensor, straight to each tensor's device."""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Optional, Union

import torch
import torch.nn as nn

from .checkpoint_files import SafetensorsFile, TorchFile, open_checkpoint, resolve_checkpoint_files
from .device_checks import check_device_value, require_present
from .device_map import device_of
from .offload import load_offloaded_weights, offload_weight, save_offload_index
from .sizes import _as_dtype
from .tensor_placement import as_device, set_module_tensor_to_device
from .tied import find_tied_parameters, retie_parameters

# set_module_tensor_to_device lives in tensor_placement.py; it stays importable from here, where Accelerate users
# of hasten.utils.modeling find it.
__all__ = ["set_module_tensor_to_device", "load_state_dict", "load_checkpoint_in_model"]

logger = logging.getLogger(__name__)
_META = torch.device("meta")
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def load_state_dict(checkpoint_file: Union[str, os.PathLike], device_map: Optional[dict] = None) -> dict:
    """Read a checkpoint file into a dict of tensors.

    With a ``device_map`` each tensor goes to the device of its module (``"disk"`` and unmapped tensors stay on
    the CPU). CPU tensors are copy-on-write views of the file, read when first used; ``.bin`` files are
    loaded with ``weights_only=True``.
    """
    path = os.fspath(checkpoint_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Checkpoint file {path!r} does not exist.")
    reader = open_checkpoint(path)
    if isinstance(reader, SafetensorsFile):
        if reader.metadata is None:
            logger.info("%s has no metadata; reading it as a PyTorch safetensors file.", path)
        reader.check_format()
    if device_map is not None:
        for key, value in device_map.items():
            check_device_value(value, key)
    state = {}
    for name, tensor in reader.tensors(mapped=lambda name: str(_load_device(name, device_map)) == "cpu"):
        device = _load_device(name, device_map)
        state[name] = tensor if str(device) == "cpu" else tensor.to(as_device(device))
    return state


def _load_device(name: str, device_map: Optional[dict]):
    if device_map is None:
        return "cpu"
    try:
        device = device_of(name, device_map)
    except KeyError:
        return "cpu"
    return "cpu" if device == "disk" else device


def _matches_module(param_name: str, module_names) -> bool:
    """Whether ``param_name`` lies inside a module called one of ``module_names`` (a full path or a name
    that appears as whole path components, e.g. ``"wo"`` for ``"...DenseReluDense.wo.weight"``)."""
    wrapped = f".{param_name}."
    return any(param_name == key or f".{key}." in wrapped for key in module_names)


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: Union[str, os.PathLike],
    device_map: Optional[dict] = None,
    offload_folder: Optional[Union[str, os.PathLike]] = None,
    dtype: Optional[Union[str, torch.dtype]] = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: Optional[list[str]] = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Load ``checkpoint`` into ``model``, sending each tensor to its device as it is read.

    Args:
        checkpoint: a state-dict file (``.safetensors`` / ``.bin``), a sharded index ``.json``, or a folder with
            ``model.safetensors`` / ``pytorch_model.bin`` or one ``*.index.json`` and its shards.
        device_map: module name -> device; ``"disk"`` entries are written to ``offload_folder``. Without a map
            the tensors are copied into the model where it is (DTensor-sharded models included).
        dtype: load floating weights in this dtype; ``keep_in_fp32_modules`` (module names) stay in float32
            when ``dtype`` is float16 or bfloat16.
        offload_state_dict: park the CPU part on disk while loading and read it back at the end, so RAM never
            holds that part plus a whole shard.
        offload_buffers: also write the buffers of ``"disk"`` modules to disk (else they stay in RAM).
        strict: the checkpoint's keys must be exactly the model's; checked before anything is loaded.
        full_state_dict / broadcast_from_rank0: for sharded (DTensor) models without a device map: the file
            holds full tensors; with ``broadcast_from_rank0`` only rank 0 reads it and sends tensor by tensor.

    Errors (missing files or folders, a key without a device, an unknown device, ``"disk"`` without an
    ``offload_folder``, mismatched keys under ``strict``) are raised before any weight is read.
    """
    if offload_8bit_bnb and any(type(p).__name__ == "Int8Params" for p in model.parameters()):
        raise NotImplementedError(
            "load_checkpoint_in_model does not offload 8-bit bitsandbytes weights: load and quantize the model with "
            "hasten.utils.load_and_quantize_model(model, BnbQuantizationConfig(load_in_8bit=True), weights_location="
            "..., device_map=..., offload_folder=...), which offloads them with their scales (docs/quantization.md).")
    dtype = _as_dtype(dtype) if dtype is not None else None
    keep_fp32 = list(keep_in_fp32_modules or [])
    tied = find_tied_parameters(model)
    if device_map is None and broadcast_from_rank0:
        from .rank0_loading import load_from_rank0

        load_from_rank0(model, lambda: _open_and_check(model, checkpoint, strict, tied), full_state_dict)
        retie_parameters(model, tied)
        return
    model_state = model.state_dict(keep_vars=True)
    readers, keys_by_file, model_keys, checkpoint_keys, unexpected, missing = _open_and_check(model, checkpoint, strict, tied)

    if device_map is None:
        _load_without_map(model, readers, keys_by_file, model_keys, full_state_dict)
    else:
        _check_map_before_loading(model, device_map, checkpoint_keys & model_keys, offload_folder, tied)
        buffers = {name for name, _ in model.named_buffers()}
        parked = tempfile.mkdtemp() if offload_state_dict else None
        try:
            offload_index, parked_index = {}, {}
            for reader, keys in _shards(readers, keys_by_file):
                wanted = [k for k in keys if k in model_keys]

                def mapped(name, reader=reader):  # stays on the CPU as stored: a zero-copy view of the file
                    device = device_of(name, device_map)
                    if str(device) != "cpu" or offload_state_dict:
                        return False
                    return _load_dtype(name, reader.dtype_of(name), dtype, keep_fp32, model_state[name]) == reader.dtype_of(name)

                for name, tensor in reader.tensors(wanted, mapped=mapped):
                    _place(model, name, tensor, device_of(name, device_map), dtype, keep_fp32, model_state[name],
                           name in buffers, offload_buffers, offload_folder, offload_index, parked, parked_index)
                if isinstance(reader, TorchFile):
                    reader.close()
            if offload_folder is not None:
                save_offload_index(offload_index, offload_folder)
            if parked is not None:
                load_offloaded_weights(model, parked_index, parked)
        finally:
            if parked is not None:
                shutil.rmtree(parked, ignore_errors=True)

    if unexpected:
        logger.warning("Some weights of the model checkpoint at %s were not used when initializing %s: %s (the "
                       "model has no such parameters or buffers; they were left out).", os.fspath(checkpoint),
                       type(model).__name__, unexpected)
    if missing and not strict:
        logger.warning("The checkpoint %s has no value for %s; they keep their current values (meta tensors stay "
                       "empty).", os.fspath(checkpoint), missing)
    retie_parameters(model, tied)


def _shards(readers, keys_by_file):
    """``(reader, keys)`` per checkpoint file, with a progress bar when there are several (main process, terminal)."""
    from ..progress import progress_bar

    pairs = list(zip(readers, keys_by_file))
    return progress_bar(pairs, desc="Loading checkpoint shards", unit="shard") if len(pairs) > 1 else pairs


def _open_and_check(model, checkpoint, strict: bool, tied):
    """Open every file of ``checkpoint`` (headers only) and compare its keys with the model's."""
    files = resolve_checkpoint_files(checkpoint)
    model_keys = set(model.state_dict().keys())
    readers = [open_checkpoint(path) for path in files]
    keys_by_file = [reader.keys() for reader in readers]
    for reader in readers:
        if isinstance(reader, SafetensorsFile):
            reader.check_format()
        elif isinstance(reader, TorchFile):
            reader.close()  # reopened when its turn comes: keeps one shard at a time in memory
    # "SCB" entries are 8-bit statistics of bitsandbytes weights (quantized loading, not handled here)
    checkpoint_keys = {key for keys in keys_by_file for key in keys if "SCB" not in key}
    unexpected = sorted(checkpoint_keys - model_keys)
    # a tied parameter is complete when any of its names is in the checkpoint
    covered_by_tie = {name for group in tied if checkpoint_keys & set(group) for name in group}
    missing = sorted(model_keys - checkpoint_keys - covered_by_tie)
    if strict and (unexpected or missing):
        raise ValueError(
            f"The checkpoint {os.fspath(checkpoint)} does not match {type(model).__name__} (strict=True): "
            f"missing keys {missing or 'none'}; unexpected keys {unexpected or 'none'}. Nothing was loaded."
        )
    return readers, keys_by_file, model_keys, checkpoint_keys, unexpected, missing


def _check_map_before_loading(model, device_map, keys_to_load, offload_folder, tied) -> None:
    if not isinstance(device_map, dict):
        raise ValueError(f"device_map must be a dict of module name -> device, got {device_map!r}.")
    for key, value in device_map.items():
        check_device_value(value, key)
    require_present(device_map)
    homeless = sorted(k for k in keys_to_load if not _has_device(k, device_map))
    if homeless:
        raise ValueError(f"The device_map gives no device for {homeless}: add their modules (or a parent) to it.")
    if "disk" in device_map.values():
        if offload_folder is None:
            disk = [k for k, v in device_map.items() if v == "disk"]
            raise ValueError(f"The device_map sends {disk} to 'disk': pass an offload_folder to write them to.")
        os.makedirs(offload_folder, exist_ok=True)
    for group in tied:
        devices = {str(device_of(name, device_map)) for name in group if _has_device(name, device_map)}
        if len(devices) > 1:
            logger.warning("Tied parameters %s are mapped to different devices %s; they will share one copy.", group, devices)


def _has_device(name: str, device_map: dict) -> bool:
    try:
        device_of(name, device_map)
        return True
    except KeyError:
        return False


def _requested_dtype(name, stored: torch.dtype, dtype, keep_fp32):
    """The dtype asked for ``name`` (None: keep the model's): ``dtype``, or float32 for keep-in-fp32 modules."""
    if dtype is not None and stored.is_floating_point and dtype in _LOW_PRECISION and _matches_module(name, keep_fp32):
        return torch.float32
    return dtype


def _load_dtype(name, stored, dtype, keep_fp32, current) -> Optional[torch.dtype]:
    """The dtype ``name`` ends up in once loaded (what ``set_module_tensor_to_device`` will cast it to)."""
    if stored is None:
        return None
    requested = _requested_dtype(name, stored, dtype, keep_fp32)
    if requested is None:
        return current.dtype
    return requested if (stored.is_floating_point or stored.is_complex) else stored


def _place(model, name, tensor, device, dtype, keep_fp32, current, is_buffer, offload_buffers, offload_folder,
           offload_index, parked, parked_index) -> None:
    """Send one checkpoint tensor where the device map wants it."""
    new_dtype = _requested_dtype(name, tensor.dtype, dtype, keep_fp32)
    to_disk = device == "disk" and (offload_buffers or not is_buffer)
    to_park = parked is not None and device == "cpu"
    if to_disk or to_park:
        if new_dtype is not None and tensor.is_floating_point():
            stored_dtype = new_dtype
        elif new_dtype is None:
            stored_dtype = current.dtype
        else:
            stored_dtype = tensor.dtype
        tensor = tensor.to(stored_dtype)
        folder, index = (offload_folder, offload_index) if to_disk else (parked, parked_index)
        set_module_tensor_to_device(model, name, "meta", dtype=stored_dtype)
        offload_weight(tensor, name, folder, index=index)
        return
    target = "cpu" if device == "disk" else device  # buffers of disk modules stay in RAM
    set_module_tensor_to_device(model, name, target, value=tensor, dtype=new_dtype, clear_cache=False)


def _load_without_map(model, readers, keys_by_file, model_keys, full_state_dict) -> None:
    """No device map: copy into the model where it is; a model still on meta takes the loaded (CPU) tensors."""
    has_dtensor = any(type(p).__name__ == "DTensor" for p in model.parameters())
    on_meta = any(t.device == _META for t in model.state_dict().values())
    for reader, keys in _shards(readers, keys_by_file):
        state = dict(reader.tensors([k for k in keys if k in model_keys]))
        if has_dtensor or not full_state_dict:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=full_state_dict, strict=False))
        else:
            model.load_state_dict(state, strict=False, assign=on_meta)
        if isinstance(reader, TorchFile):
            reader.close()
        del state
