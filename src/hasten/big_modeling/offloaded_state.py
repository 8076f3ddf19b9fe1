"""The real weights of a model dispatched with CPU or disk offload.

``cpu_offload``, ``disk_offload`` and ``dispatch_model`` with ``"cpu"``/``"disk"`` in the device map leave
the offloaded weights on the meta device; the ``AlignDevicesHook`` of each module holds the real ones (a CPU
state dict or an offload folder) and brings them in only for the module's forward. A plain
``model.state_dict()`` therefore holds empty meta tensors. These functions bring each module's weights in the
same way, one module at a time, so a state dict (or ``save_model``) gets the real values.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Optional, Union

import torch
from torch import nn

from .hooks import AlignDevicesHook, SequentialHook
from .tensor_placement import set_module_tensor_to_device

__all__ = ["has_offloaded_params", "align_module_device", "get_state_dict_offloaded_model",
           "get_state_dict_from_offload"]

logger = logging.getLogger(__name__)

_META = torch.device("meta")


def _offload_hooks(module: nn.Module) -> list:
    """The offloading ``AlignDevicesHook``s attached to ``module`` (also inside a ``SequentialHook``)."""
    hook = getattr(module, "_hf_hook", None)
    hooks = hook.hooks if isinstance(hook, SequentialHook) else (hook,)
    return [h for h in hooks if isinstance(h, AlignDevicesHook) and h.offload]


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether ``module`` has a hook that keeps its weights offloaded (on meta between forwards)."""
    return bool(_offload_hooks(module))


@contextlib.contextmanager
def align_module_device(module: nn.Module,
                        execution_device: Optional[Union[int, str, torch.device]] = None) -> Iterator[None]:
    """Within the block, ``module``'s offloaded weights are real, on its hook's execution device (or on
    ``execution_device`` when given); afterwards they are offloaded again.

    A module without offloading hook: with ``execution_device`` its own parameters are moved there for the
    block and back afterwards; without, nothing changes.
    """
    hooks = _offload_hooks(module)
    if hooks:
        original = [hook.execution_device for hook in hooks]
        if execution_device is not None:
            for hook in hooks:
                hook.execution_device = execution_device
        try:
            for hook in hooks:
                hook.pre_forward(module)
            yield
        finally:
            for hook, device in zip(hooks, original):
                hook.post_forward(module, None)
                hook.execution_device = device
    elif execution_device is not None:
        devices = {name: param.device for name, param in module.named_parameters(recurse=False)}
        try:
            for name in devices:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, device in devices.items():
                set_module_tensor_to_device(module, name, device)
    else:
        yield


def get_state_dict_offloaded_model(model: nn.Module) -> dict:
    """``model``'s state dict with the real values of its offloaded weights, every tensor on the CPU.

    Each offloaded module is brought to the CPU in turn, so the whole model must fit in CPU memory but never
    on the accelerator. Keys and their order are those of ``model.state_dict()``; weights that stay on meta
    (never loaded) are left out, with a warning.
    """
    state = model.state_dict()
    for name, module in model.named_modules():
        if not has_offloaded_params(module):
            continue
        prefix = f"{name}." if name else ""
        try:
            with align_module_device(module, "cpu"):
                for key, value in module.state_dict().items():
                    if prefix + key in state and value.device != _META:
                        state[prefix + key] = value.to("cpu")
        except MemoryError:
            raise MemoryError("An offloaded module must fit in CPU memory to get its state dict (save_model).") from None
    placeholders = [key for key, value in state.items() if isinstance(value, torch.Tensor) and value.device == _META]
    if placeholders:
        logger.warning("These weights are on the meta device (never loaded) and are left out: %s",
                       ", ".join(placeholders))
    return {key: value.to("cpu") if isinstance(value, torch.Tensor) else value
            for key, value in state.items() if key not in placeholders}


def get_state_dict_from_offload(module: nn.Module, module_name: str, state_dict: dict,
                                device_to_put_offload: Union[int, str, torch.device] = "cpu") -> dict:
    """Fill ``state_dict``'s entries for ``module`` (``module_name`` is the full name of one of its weights,
    e.g. ``"decoder.layer.weight"``) with their real values, brought to ``device_to_put_offload`` when the
    module is offloaded. Returns ``state_dict``."""
    root = module_name[: module_name.rfind(".")]  # the module's name, without ".weight" / ".bias"
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, value in module.state_dict().items():
            if f"{root}.{key}" in state_dict:
                state_dict[f"{root}.{key}"] = value
    return state_dict
