"""Whether a model loaded in 8-bit or 4-bit (bitsandbytes, through transformers) can be trained as it is placed.

A quantized model dispatched with a device map cannot be moved or wrapped like a plain one. ``prepare`` refuses,
before anything is wrapped, the three placements whose training fails later inside bitsandbytes or DDP: layers
spread over several devices in a distributed run, layers on the CPU or disk (unless bitsandbytes' multi-backend
build or an XPU runs them there), and a model on another device than this process's.
"""
from __future__ import annotations

import torch
from torch import nn


def check_quantized_model_trainable(model: nn.Module, *, distributed: bool, device: torch.device,
                                    offload_supported: bool) -> None:
    """Raise ``ValueError`` when ``model`` (quantized and dispatched) cannot be trained where it is.

    ``offload_supported``: bitsandbytes can run its layers on the CPU here (its multi-backend build, or an XPU).
    """
    placed = set(model.hf_device_map.values())
    if len(placed) > 1 and distributed:
        raise ValueError(
            "You can't train a model that has been loaded in 8-bit or 4-bit precision on multiple devices in any "
            f"distributed mode: its device map places it on {sorted(map(str, placed))}. Load it on one device per "
            "process, e.g. device_map={'': accelerator.process_index}."
        )
    if placed & {"cpu", "disk"} and not offload_supported:
        raise ValueError(
            "You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or disk offload: "
            "bitsandbytes runs these layers on the accelerator only. Load the model without offload (a device map "
            "with no 'cpu' or 'disk' entry)."
        )
    if len(placed) == 1:
        (where,) = placed
        if where in ("cpu", "disk"):
            return
        target = torch.device(where) if not isinstance(where, int) else torch.device(device.type, where)
        index = device.index if device.index is not None else 0
        if target.type != device.type or (target.index if target.index is not None else 0) != index:
            raise ValueError(
                "You can't train a model that has been loaded in 8-bit or 4-bit precision on a different device "
                f"than the one you're training on: the model is on {target}, this process trains on {device}. Load "
                "it with device_map={'': accelerator.device}."
            )
