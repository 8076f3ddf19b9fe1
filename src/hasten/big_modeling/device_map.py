"""Device maps: which device each part of a model lives on (``{"embed": 0, "h.0": 0, "h.1": "cpu", "head": "disk"}``)."""
from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from typing import Optional, Union

import torch
import torch.nn as nn

from ..core.aliases import Device
from ..core.gc_pause import gc_paused

from .device_checks import check_device_value
from .planner import DevicePlanner
from .sizes import _as_class_names, _as_dtype, get_max_memory

logger = logging.getLogger(__name__)

__all__ = ["infer_auto_device_map", "check_device_map", "clean_device_map", "check_tied_parameters_on_same_device"]


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Optional[dict] = None,
    no_split_module_classes: Optional[list[str]] = None,
    dtype: Optional[Union[str, torch.dtype]] = None,
    special_dtypes: Optional[dict] = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> OrderedDict:
    """Plan where each part of ``model`` goes: GPUs first (by index), then the CPU, then ``"disk"``.

    Works from shapes and dtypes only, so ``model`` may be on the meta device. Guarantees: no device gets more
    than its ``max_memory``; while anything is offloaded, GPU 0 (and the CPU, when layers go to disk) keeps room
    for the largest layer so it can be brought back for its forward.

    Args:
        max_memory: bytes per device, e.g. ``{0: "10GiB", 1: 10**10, "cpu": "30GB"}``; default: what is free now.
            Integer ids are planned for even on a machine without them. Never modified.
        no_split_module_classes: class names whose instances stay whole on one device (blocks with residuals).
        dtype: the dtype the weights will be loaded in; ``special_dtypes``: per-tensor-name overrides.
        verbose: print each decision.
        clean_result: merge the entries of a module whose parts all landed on the same device.
        offload_buffers: whether buffers of offloaded modules are offloaded too (only affects a warning here).
        fallback_allocation: when nothing fits on a device, look deeper for any module that does before moving on.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"infer_auto_device_map needs an nn.Module, got {type(model).__name__}.")
    budget = get_max_memory(max_memory)
    if dtype is not None:
        dtype = _as_dtype(dtype)
    with gc_paused():  # planning makes many small objects and no cycles: a collection pass is pure cost
        planner = DevicePlanner(model, budget, _as_class_names(no_split_module_classes), dtype, special_dtypes,
                                verbose, offload_buffers, fallback_allocation)
        device_map = planner.run()
    if clean_result:
        device_map = clean_device_map(device_map)
    return device_map


def clean_device_map(device_map: dict, module_name: str = "") -> dict:
    """Merge entries: every module whose parts (two or more entries) all share one device becomes one entry.

    The outermost such module wins; a merged entry takes the position of its first part. Modifies and returns
    ``device_map``.
    """
    entries = list(device_map.items())
    prefix = f"{module_name}." if module_name else ""
    scoped = [(i, k, v) for i, (k, v) in enumerate(entries) if k.startswith(prefix)]
    merged: list[tuple[int, str, object]] = []
    _merge(scoped, module_name, merged)
    keep = [(i, k, v) for i, (k, v) in enumerate(entries) if not k.startswith(prefix)] + merged
    keep.sort(key=lambda item: item[0])
    device_map.clear()
    device_map.update((k, v) for _, k, v in keep)
    return device_map


def _merge(entries: list, module_name: str, out: list) -> None:
    """``entries`` are the (position, key, device) strictly below ``module_name`` (all of them at the root)."""
    devices = {v for _, _, v in entries}
    if len(entries) > 1 and len(devices) == 1:
        out.append((entries[0][0], module_name, entries[0][2]))
        return
    depth = module_name.count(".") + 1 if module_name else 0
    groups: dict[str, list] = {}
    for position, key, value in entries:
        parts = key.split(".")
        if len(parts) <= depth:  # the module's own entry (only possible at the root): kept as is
            out.append((position, key, value))
            continue
        child = ".".join(parts[: depth + 1])
        groups.setdefault(child, [])
        if key != child:
            groups[child].append((position, key, value))
        else:
            out.append((position, key, value))
    for child, below in groups.items():
        if below:
            _merge(below, child, out)


def check_device_map(model: nn.Module, device_map: dict) -> None:
    """Raise a ValueError if ``device_map`` uses an unknown device or leaves a parameter or persistent buffer
    without a device. Keys that are neither a submodule nor a tensor of ``model`` place nothing: a UserWarning
    names them (as the reference does), and they are left out of the placement."""
    if not isinstance(device_map, dict):
        raise ValueError(f"device_map must be a dict like {{'': 'cpu'}} or {{'h.0': 0, 'h.1': 'disk'}}, got {device_map!r}.")
    modules = dict(model.named_modules())
    state_keys = list(model.state_dict().keys())
    known = (set(modules) | set(state_keys) | {name for name, _ in model.named_parameters(remove_duplicate=False)}
             | {name for name, _ in model.named_buffers()})
    unknown = [key for key in device_map if key != "" and key not in known]
    if unknown:
        warnings.warn(
            f"The following device_map keys do not match any submodules or tensors of {type(model).__name__} and "
            f"place nothing: {unknown}. Use names from model.named_modules().", UserWarning, stacklevel=2)
    for key, value in device_map.items():
        check_device_value(value, key)
    if "" in device_map:
        return
    uncovered = [name for name in state_keys if not _has_device(name, device_map)]
    if uncovered:
        raise ValueError(
            f"The device_map gives no device for these parameters/buffers: {', '.join(uncovered)}. Add their "
            "module (or a parent) to the map, or plan with infer_auto_device_map."
        )


def _has_device(name: str, device_map: dict) -> bool:
    parts = name.split(".")
    return any(".".join(parts[:end]) in device_map for end in range(1, len(parts) + 1))


def device_of(name: str, device_map: dict) -> Device:
    """The device the map gives to the tensor or module ``name`` (its longest listed prefix); KeyError if none."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        key = ".".join(parts[:end])
        if key in device_map:
            return device_map[key]
    if "" in device_map:
        return device_map[""]
    raise KeyError(name)



def check_tied_parameters_on_same_device(tied_params: list, device_map: dict) -> None:
    """Warn for each group of tied parameters that ``device_map`` spreads over several devices (a tied weight
    has one storage, so it cannot live in two places). A name the map does not cover raises ValueError."""
    for group in tied_params:
        devices = {}
        for name in group:
            try:
                devices[name] = device_of(name, device_map)
            except KeyError:
                raise ValueError(f"The device_map does not contain the module of {name!r}.") from None
        if len(set(map(str, devices.values()))) > 1:
            logger.warning("Tied parameters are on different devices: %s. Please modify your custom device map or "
                           "set `device_map='auto'`.", devices)
