"""Running a model spread over devices: dispatch by device map, full CPU or disk offload, and the one-call
``load_checkpoint_and_dispatch``."""
from __future__ import annotations

import functools
import json
import logging
import os
from typing import Optional, Union

import torch
import torch.nn as nn

from .device_checks import require_present
from .module_tensors import get_tensor
from .device_map import check_device_map, infer_auto_device_map
from .hooks import (AlignDevicesHook, CpuOffload, UserCpuOffloadHook, add_hook_to_module, attach_align_device_hook,
                    attach_align_device_hook_on_blocks)
from .loading import load_checkpoint_in_model
from .offload import INDEX_FILE, OffloadedWeightsLoader, extract_submodules_state_dict, offload_state_dict
from .sizes import get_balanced_memory
from .tied import find_tied_parameters, retie_parameters

__all__ = ["dispatch_model", "cpu_offload", "cpu_offload_with_hook", "disk_offload", "load_checkpoint_and_dispatch"]

logger = logging.getLogger(__name__)
_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def _first_device(model: nn.Module):
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def cpu_offload(model: nn.Module, execution_device: Optional[torch.device] = None, offload_buffers: bool = False,
                state_dict: Optional[dict] = None, preload_module_classes: Optional[list[str]] = None) -> nn.Module:
    """Keep one copy of the weights on the CPU and bring each submodule's weights to ``execution_device`` only
    for its forward (default device: where the model's first parameter is)."""
    if execution_device is None:
        execution_device = _first_device(model)
    if state_dict is None:
        state_dict = {name: tensor.to("cpu") for name, tensor in model.state_dict().items()}
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(model, execution_device=execution_device, offload=True, offload_buffers=offload_buffers,
                             weights_map=state_dict, preload_module_classes=preload_module_classes)
    return model


def cpu_offload_with_hook(model: nn.Module, execution_device: Optional[Union[int, str, torch.device]] = None,
                          prev_module_hook: Optional[UserCpuOffloadHook] = None,
                          ) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep ``model`` on the CPU until its forward, then leave it on ``execution_device`` until the returned
    hook's ``offload()`` is called (or the next model of the pipeline, given ``prev_module_hook``, runs).

    Returns ``(model, hook)``.
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(model: nn.Module, offload_dir: Union[str, os.PathLike], execution_device: Optional[torch.device] = None,
                 offload_buffers: bool = False, preload_module_classes: Optional[list[str]] = None) -> nn.Module:
    """Write the weights to ``offload_dir`` (unless it already holds an offload index) and read each
    submodule's weights from there only for its forward."""
    if not os.path.isfile(os.path.join(offload_dir, INDEX_FILE)):
        offload_state_dict(offload_dir, model.state_dict())
    if execution_device is None:
        execution_device = _first_device(model)
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(model, execution_device=execution_device, offload=True, offload_buffers=offload_buffers,
                             weights_map=weights_map, preload_module_classes=preload_module_classes)
    return model


def _main_device(device_map: dict):
    """The first device of the map that is not an offload target (the CPU if all are)."""
    for device in device_map.values():
        if device not in ("cpu", "disk"):
            return device
    return "cpu"


def _guard_moves(model: nn.Module) -> None:
    """Wrap ``model.to`` / ``model.cuda``: moving a dispatched model would undo the placement."""

    def guarded(method):
        @functools.wraps(method)
        def wrapper(*args, **kwargs):
            if any(p.device == torch.device("meta") for p in model.parameters()):
                raise RuntimeError(
                    "This model has modules offloaded to the CPU or disk (their weights are on the meta device "
                    "between forwards), so it cannot be moved; dispatch it again with another device map."
                )
            logger.warning("Moving a model dispatched with hooks: the hooks will move the weights back on forward.")
            return method(*args, **kwargs)

        return wrapper

    model.to = guarded(model.to)
    model.cuda = guarded(model.cuda)


def _complete_offload_folder(model: nn.Module, offload_dir, disk_modules: list[str], offload_buffers: bool) -> None:
    """Make sure ``offload_dir`` holds every weight of the disk modules, writing the ones it lacks from the model."""
    index = {}
    path = os.path.join(offload_dir, INDEX_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            index = json.load(handle)
    buffers = {name for name, _ in model.named_buffers()}
    needed = extract_submodules_state_dict(model.state_dict(), disk_modules)
    lacking = {k: v for k, v in needed.items() if k not in index and (offload_buffers or k not in buffers)}
    empty = [k for k, v in lacking.items() if v.device == torch.device("meta")]
    if empty:
        raise ValueError(
            f"{offload_dir} has no offloaded value for {empty}, and the model holds none either (meta tensors): "
            "load the checkpoint with load_checkpoint_in_model(..., offload_folder=...) first."
        )
    if lacking:
        offload_state_dict(offload_dir, lacking)


def dispatch_model(model: nn.Module, device_map: dict, main_device: Optional[torch.device] = None,
                   state_dict: Optional[dict] = None, offload_dir: Optional[Union[str, os.PathLike]] = None,
                   offload_index: Optional[dict] = None, offload_buffers: bool = False,
                   skip_keys: Optional[Union[str, list[str]]] = None, preload_module_classes: Optional[list[str]] = None,
                   force_hooks: bool = False) -> nn.Module:
    """Place ``model`` according to ``device_map`` and attach the hooks that make it run across devices.

    Modules mapped to ``"cpu"`` (when the main device is an accelerator) or ``"disk"`` keep their weights
    there and bring them to ``main_device`` (default: the first accelerator of the map) for their forward.
    With a single device and no ``force_hooks`` the model is simply moved there.

    Args:
        state_dict: the CPU weights of the offloaded modules (default: taken from the model).
        offload_dir: folder holding (or receiving) the weights of ``"disk"`` modules; ``offload_index`` an index
            of already-offloaded weights instead.
        skip_keys: input/output keys never moved between devices.
        preload_module_classes: classes whose offloaded instances load all their weights before their forward.
    """
    check_device_map(model, device_map)
    require_present(device_map)
    devices = set(device_map.values())
    if len(devices) == 1 and "disk" not in devices and not force_hooks:
        (device,) = devices
        model.to(device)
        model.hf_device_map = dict(device_map)
        return model

    if main_device is None:
        main_device = _main_device(device_map)
    disk_modules = [name for name, device in device_map.items() if device == "disk"]
    if disk_modules and offload_dir is None and offload_index is None:
        raise ValueError(
            f"The device_map sends {disk_modules} to 'disk': pass offload_dir (a folder for their weights) or an "
            "offload_index."
        )
    if main_device != "cpu":
        cpu_modules = [name for name, device in device_map.items() if device == "cpu"]
        if state_dict is None and cpu_modules:
            state_dict = extract_submodules_state_dict(model.state_dict(), cpu_modules)
    if disk_modules and offload_index is None:
        _complete_offload_folder(model, offload_dir, disk_modules, offload_buffers)

    execution_device = {name: main_device if device in ("cpu", "disk") else device for name, device in device_map.items()}
    execution_device[""] = main_device
    offloaded = ("disk",) if main_device in ("cpu", "mps") else ("cpu", "disk")
    offload = {name: device in offloaded for name, device in device_map.items()}
    save_folder = offload_dir if disk_modules else None
    weights_map = None
    if state_dict is not None or save_folder is not None or offload_index is not None:
        weights_map = OffloadedWeightsLoader(state_dict=state_dict, save_folder=save_folder, index=offload_index,
                                             device=main_device if offload_index is not None else None)

    tied_params = find_tied_parameters(model)
    tied_params_map = {}
    for group in tied_params:
        for name in group:
            tensor = get_tensor(model, name)
            if tensor.device != torch.device("meta"):
                tied_params_map[tensor.data_ptr()] = {}
    attach_align_device_hook_on_blocks(model, execution_device=execution_device, offload=offload,
                                       offload_buffers=offload_buffers, weights_map=weights_map, skip_keys=skip_keys,
                                       preload_module_classes=preload_module_classes, tied_params_map=tied_params_map)
    offloaded_to = sorted({d for d in device_map.values() if d in ("cpu", "disk")})
    if offloaded_to:
        logger.info("Some parameters are on the meta device between forwards: they are offloaded to %s.",
                    " and ".join(offloaded_to))
    retie_parameters(model, tied_params)
    _guard_moves(model)
    model.hf_device_map = dict(device_map)
    return model


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: Union[str, os.PathLike],
    device_map: Optional[Union[str, dict]] = None,
    max_memory: Optional[dict] = None,
    no_split_module_classes: Optional[list[str]] = None,
    offload_folder: Optional[Union[str, os.PathLike]] = None,
    offload_buffers: bool = False,
    dtype: Optional[Union[str, torch.dtype]] = None,
    offload_state_dict: Optional[bool] = None,
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> nn.Module:
    """Load ``checkpoint`` into ``model`` (usually built under ``init_empty_weights``) and dispatch it.

    ``device_map`` is a dict, or a strategy: ``"auto"``/``"balanced"`` (spread evenly over the GPUs),
    ``"balanced_low_0"`` (keep GPU 0 light) or ``"sequential"`` (fill GPUs in order), each then spilling to
    the CPU and ``offload_folder``. ``offload_state_dict`` defaults to True when something goes to disk. The
    other arguments are those of ``load_checkpoint_in_model`` and ``dispatch_model``. Without a device map the
    weights are loaded where the model is and no hook is attached.
    """
    if isinstance(device_map, str):
        if device_map not in _STRATEGIES:
            raise ValueError(f"device_map={device_map!r} is not a strategy: use a dict or one of {', '.join(_STRATEGIES)}.")
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split_module_classes,
                                             dtype=dtype, low_zero=(device_map == "balanced_low_0"))
        device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split_module_classes,
                                           dtype=dtype, offload_buffers=offload_buffers)
    if device_map is not None:
        check_device_map(model, device_map)
        if "disk" in device_map.values() and offload_folder is None:
            disk = [name for name, device in device_map.items() if device == "disk"]
            raise ValueError(f"The device map sends {disk} to 'disk': pass an offload_folder to keep their weights in.")
    if offload_state_dict is None:
        offload_state_dict = device_map is not None and "disk" in device_map.values()
    load_checkpoint_in_model(model, checkpoint, device_map=device_map, offload_folder=offload_folder, dtype=dtype,
                             offload_state_dict=offload_state_dict, offload_buffers=offload_buffers, strict=strict,
                             full_state_dict=full_state_dict, broadcast_from_rank0=broadcast_from_rank0)
    if device_map is None:
        return model
    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder, offload_buffers=offload_buffers,
                          skip_keys=skip_keys, preload_module_classes=preload_module_classes, force_hooks=force_hooks)
