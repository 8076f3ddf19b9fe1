"""The one place that imports bitsandbytes, lazily: it is an optional extra, and importing it initialises the GPU."""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Optional

import torch
import torch.nn as nn

INSTALL_HINT = "pip install 'hasten[bnb]'"


def import_bnb(feature: str = "8-bit / 4-bit quantization") -> ModuleType:
    """The ``bitsandbytes`` module, or an ImportError that names the extra to install."""
    try:
        import bitsandbytes
    except ImportError:
        raise ImportError(f"{feature} needs the `bitsandbytes` package, which is not installed (or failed to import): "
                          f"{INSTALL_HINT}") from None
    return bitsandbytes


def loaded_bnb() -> Optional[ModuleType]:
    """bitsandbytes if the program imported it already, else None (no bnb layer can exist without it)."""
    return sys.modules.get("bitsandbytes")


def is_bnb_layer(module: nn.Module) -> bool:
    """Whether ``module`` is a bitsandbytes 8-bit or 4-bit linear layer."""
    bnb = loaded_bnb()
    layers = getattr(bnb, "nn", None)
    classes = tuple(getattr(layers, name) for name in ("Linear8bitLt", "Linear4bit") if hasattr(layers, name))
    return bool(classes) and isinstance(module, classes)


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds bitsandbytes ``Linear4bit`` layers."""
    bnb = loaded_bnb()
    if bnb is None:  # never imported, so no such layer can exist
        return False
    return any(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """The device of the first parameter of ``parameter`` (a module)."""
    return next(parameter.parameters()).device
