"""Tied parameters: one ``nn.Parameter`` reachable under several names (e.g. input embeddings and the LM head)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .module_tensors import owner_of, walk_modules

__all__ = ["find_tied_parameters", "retie_parameters"]


def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups of names that refer to the same parameter object, each group sorted, groups in model order.

    ``[['decoder.weight', 'encoder.embed.weight']]`` for a model whose decoder reuses the embedding matrix.
    (``kwargs`` is accepted for Accelerate compatibility and ignored.)
    """
    names_by_param: dict[int, list[str]] = {}
    for prefix, module in walk_modules(model, remove_duplicate=False):
        for key, param in module._parameters.items():
            if param is not None:
                names_by_param.setdefault(id(param), []).append(f"{prefix}.{key}" if prefix else key)
    return [sorted(set(names)) for names in names_by_param.values() if len(set(names)) > 1]


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every name of each group point at one parameter again (the first that holds real data).

    Replacing a parameter (loading, moving to meta, attaching hooks) breaks the sharing; this restores it.
    """
    for group in tied_params:
        keeper = None
        for name in group:
            module, leaf = owner_of(model, name)
            param = getattr(module, leaf)
            if param.device != torch.device("meta"):
                keeper = param
                break
        if keeper is None:
            continue
        for name in group:
            module, leaf = owner_of(model, name)
            setattr(module, leaf, keeper)
