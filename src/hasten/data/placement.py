"""Knowing, cheaply, that a batch is already on the loader's device.

``send_to_device`` walks a batch and rebuilds every list, tuple and dict around tensors that ``.to()`` hands
back unchanged when they already live on the device (the usual case on the CPU): a few microseconds per batch
for nothing. The prepared loaders ask ``on_device`` first and keep the batch as it is when it says yes;
otherwise they move it with ``send_to_device``, as before.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Union

import torch

from ..core.aliases import Device, NestedData

__all__ = ["as_device", "on_device"]

_TENSOR = torch.Tensor


def as_device(device: Device) -> Union[torch.device, Device]:
    """``device`` as a ``torch.device`` to compare tensors' devices with (unchanged when torch cannot read it)."""
    if isinstance(device, torch.device):
        return device
    try:
        return torch.device(device)
    except (TypeError, RuntimeError, ValueError):
        return device


def on_device(data: NestedData, device: Union[torch.device, Device]) -> bool:
    """Whether ``send_to_device(data, device)`` would return the very same tensors and other values.

    True when every tensor of ``data`` (nested in lists, tuples and dicts) is a plain ``torch.Tensor`` already on
    ``device`` and nothing else in it has a ``.to`` method (a tensor subclass or an object with its own ``.to``,
    such as ``BatchEncoding``, is always handed to ``send_to_device``)."""
    if type(data) is _TENSOR:  # the exact type: a subclass's .to() may do more than move
        return data.device == device
    if isinstance(data, (list, tuple)):
        for item in data:
            if type(item) is _TENSOR:  # the usual element, checked here: one call less per tensor
                if item.device != device:
                    return False
            elif not on_device(item, device):
                return False
        return True
    if isinstance(data, Mapping):
        if hasattr(data, "to"):
            return False
        for value in data.values():
            if not on_device(value, device):
                return False
        return True
    return not hasattr(data, "to")

