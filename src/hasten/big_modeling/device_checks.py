"""What a device map may name as a device, checked before anything is moved or loaded."""
from __future__ import annotations

from collections.abc import Mapping

import torch

from ..core.aliases import Device
from .device_memory import accelerator_count, accelerator_type

_NAMED = ("cpu", "disk", "meta", "mps")


def check_device_value(value: Device, where: str = "") -> None:
    """Raise a ValueError unless ``value`` is a device a device map may use: an int (accelerator index),
    ``"cpu"``, ``"disk"``, ``"meta"``, ``"mps"``, a device string such as ``"cuda:1"``, or a ``torch.device``."""
    if isinstance(value, bool):
        pass
    elif isinstance(value, int):
        if value >= 0:
            return
    elif isinstance(value, torch.device):
        return
    elif isinstance(value, str):
        if value in _NAMED:
            return
        try:
            torch.device(value)
            return
        except (RuntimeError, ValueError):
            pass
    place = f" for {where!r}" if where else ""
    raise ValueError(
        f"Unknown device {value!r}{place} in the device map: use an accelerator index (0, 1, ...), 'cpu', 'disk', "
        "'meta', 'mps' or a device string such as 'cuda:1'."
    )


def to_torch_device(value: Device) -> torch.device:
    """A device-map value as a ``torch.device`` (ints are indices of this machine's accelerator)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return torch.device(accelerator_type() or "cuda", value)
    return torch.device(value)


def require_present(device_map: Mapping[str, Device]) -> None:
    """Raise before loading if the map uses an accelerator this machine does not have."""
    count = accelerator_count()
    kind = accelerator_type()
    for name, value in device_map.items():
        if value in ("disk",):
            continue
        device = to_torch_device(value)
        if device.type in ("cpu", "meta"):
            continue
        if device.type == "mps" and kind == "mps":
            continue
        if device.type == kind and (device.index or 0) < count:
            continue
        raise ValueError(
            f"The device map puts {name or 'the model'!r} on {value!r}, but this machine has "
            f"{f'{count} {kind} device(s)' if kind else 'no accelerator'}. Plan with the devices that exist "
            "(infer_auto_device_map uses them by default) or use 'cpu' / 'disk'."
        )
