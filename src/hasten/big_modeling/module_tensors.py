"""Walking a module's parameters and buffers by dotted name (shared by sizing, loading and the hooks)."""
from __future__ import annotations

from typing import Iterator

import torch
import torch.nn as nn


def named_module_tensors(module: nn.Module, include_buffers: bool = True, recurse: bool = False,
                         remove_non_persistent: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters, then (optionally) buffers of ``module``; ``remove_non_persistent`` drops buffers that
    ``state_dict`` would not save (they are never offloaded: there is no file value to bring back)."""
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skipped = get_non_persistent_buffers(module, recurse=recurse) if remove_non_persistent else set()
        for name, buffer in module.named_buffers(recurse=recurse):
            if name not in skipped:
                yield name, buffer


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the buffers registered with ``persistent=False``.

    Without ``fqns`` the names are the buffers' own (last) names, which is what ``named_module_tensors`` compares
    against when ``recurse`` is off; with ``fqns`` they are dotted paths from ``module``.
    """
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, sub in module.named_modules():
            if fqns:
                names |= {f"{prefix}.{b}" if prefix else b for b in sub._non_persistent_buffers_set}
            else:
                names |= sub._non_persistent_buffers_set
    return names


def owner_of(root: nn.Module, dotted_name: str) -> tuple[nn.Module, str]:
    """``("h.0.attn.weight")`` -> (the ``h.0.attn`` module, ``"weight"``), with an error naming the missing step."""
    *path, leaf = dotted_name.split(".")
    module = root
    for step in path:
        child = getattr(module, step, None)
        if not isinstance(child, nn.Module):
            raise ValueError(
                f"{type(root).__name__} has no submodule {step!r} on the way to {dotted_name!r}: check the name "
                "against model.named_parameters() / model.named_buffers()."
            )
        module = child
    return module, leaf


def get_tensor(root: nn.Module, dotted_name: str) -> torch.Tensor:
    """The parameter or buffer called ``dotted_name`` (or any attribute at that path)."""
    module, leaf = owner_of(root, dotted_name)
    return getattr(module, leaf)


def tensor_bytes_view(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor (so file bytes can be read straight into it)."""
    flat = tensor.reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    return memoryview(flat.numpy()).cast("B")


def walk_modules(model: nn.Module, remove_duplicate: bool = True) -> list[tuple[str, nn.Module]]:
    """``list(model.named_modules(remove_duplicate=...))``, in the same pre-order, without generator overhead
    (planning a 10,000-module model walks the tree several times)."""
    out: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        prefix, module = stack.pop()
        if remove_duplicate:
            if id(module) in seen:
                continue
            seen.add(id(module))
        out.append((prefix, module))
        children = [(f"{prefix}.{name}" if prefix else name, child)
                    for name, child in module._modules.items() if child is not None]
        stack.extend(reversed(children))
    return out
