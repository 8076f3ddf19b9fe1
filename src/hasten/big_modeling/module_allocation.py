"""Accelerate's building blocks for placing modules on devices by size (``accelerate.utils.modeling``).

``infer_auto_device_map`` (``hasten.big_modeling.device_map``) has its own planner; these functions are the
reference's public helpers for code that plans by hand, working on the ``{name: bytes}`` dictionaries of
``compute_module_sizes`` and on ``[(name, module), ...]`` lists of the modules still to place.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from .sizes import convert_file_size_to_int

__all__ = ["get_module_leaves", "get_module_size_with_ties", "fallback_allocate"]


def get_module_leaves(module_sizes: dict) -> list[str]:
    """The names in ``module_sizes`` that have no child listed there (the root ``""`` excluded)."""
    children: dict = {}
    for name in module_sizes:
        if name and "." in name:
            parent = name.rsplit(".", 1)[0]
            children[parent] = children.get(parent, 0) + 1
    return [name for name in module_sizes if name and children.get(name, 0) == 0]


def _owner(tensor_name: str, modules_to_treat: list) -> tuple[str, object]:
    for name, module in modules_to_treat:
        if tensor_name.startswith(name + "."):
            return name, module
    raise ValueError(
        f"Tied parameter {tensor_name!r} belongs to none of the modules still to place "
        f"({[name for name, _ in modules_to_treat][:10]} ...)."
    )


def get_module_size_with_ties(tied_params: list, module_size: int, module_sizes: dict,
                              modules_to_treat: list) -> tuple[int, list, list]:
    """The size of a module together with the modules its tied parameters live in (they must be placed with it).

    Returns ``(total size, names of those modules, the modules)``. Each tied parameter's own size is counted
    once: its module's size is added minus the parameter, which the first module already holds.
    """
    if not tied_params:
        return module_size, [], []
    owners = [_owner(param, modules_to_treat) for param in tied_params]
    total = module_size
    for param, (owner_name, _) in zip(tied_params, owners):
        total += module_sizes[owner_name] - module_sizes[param]
    return total, [name for name, _ in owners], [module for _, module in owners]


def _children_of(name: str, module) -> list:
    if isinstance(module, (nn.Parameter, torch.Tensor)):
        return []
    return [(f"{name}.{child}", value)
            for child, value in list(module.named_parameters(recurse=False)) + list(module.named_children())]


def fallback_allocate(
    modules: list,
    module_sizes: dict,
    size_limit: Union[int, str],
    no_split_module_classes: Optional[list] = None,
    tied_parameters: Optional[list] = None,
) -> tuple[Optional[str], Optional[nn.Module], list]:
    """Find, breadth first, a module (or parameter) of ``modules`` that fits in ``size_limit`` with its ties.

    Modules too big are split into their direct parameters and children (unless their class is in
    ``no_split_module_classes``). Returns ``(name, module, remaining)`` where ``remaining`` is ``modules`` with
    the found one taken out (its ancestors replaced by their other children), or ``(None, None, modules)``
    when nothing fits or ``size_limit`` cannot be read as a size.
    """
    try:
        size_limit = convert_file_size_to_int(size_limit)
    except ValueError:
        return None, None, modules
    no_split = set(no_split_module_classes or [])
    tied_parameters = tied_parameters or []

    to_search = list(modules)
    found = None
    while to_search:
        name, module = to_search.pop(0)
        groups = [group for group in tied_parameters
                  if any(name + "." in key + "." for key in group) and not all(name + "." in key + "." for key in group)]
        outside = [key for group in groups for key in group if name + "." not in key + "."]
        size, _, _ = get_module_size_with_ties(outside, module_sizes[name], module_sizes, to_search)
        if size <= size_limit:
            found = name
            break
        children = _children_of(name, module)
        if not children or type(module).__name__ in no_split:
            continue
        to_search = children + to_search
    if found is None:
        return None, None, modules

    # Replace each listed ancestor of the found module by its parts, until the found module is listed itself.
    remaining = list(modules)
    for end in [i for i, char in enumerate(found) if char == "."]:
        parent = found[:end]
        names = [n for n, _ in remaining]
        if parent in names:
            index = names.index(parent)
            remaining[index:index + 1] = _children_of(parent, remaining[index][1])
    names = [n for n, _ in remaining]
    name, module = remaining.pop(names.index(found))
    return name, module, remaining
