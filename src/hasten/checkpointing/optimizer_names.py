"""Optimizer states keyed by parameter name and by position, and the conversion between the two.

``optimizer.state_dict()``, which unsharded strategies (and the reference library) write, keys an optimizer's state
by position; torch's ``get_optimizer_state_dict`` (sharded backends, DCP checkpoints) keys it by parameter name. A
state is converted with the names of the parameters in the optimizer's own order, so a checkpoint saved under one
strategy loads under another.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["clean_name", "parameter_names", "by_position", "by_name", "is_shard", "is_local_state"]

_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_name(name: str) -> str:
    """A parameter's name without the wrappers' segments (activation checkpointing, compile, FSDP1)."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """For each parameter group of ``optimizer``, the names (in ``model``) of its parameters, in order."""
    names = {id(param): clean_name(name) for name, param in model.named_parameters()}
    groups = []
    for group in optimizer.param_groups:
        missing = [i for i, param in enumerate(group["params"]) if id(param) not in names]
        if missing:
            raise ValueError(
                f"The optimizer holds {len(missing)} parameter(s) that are not parameters of its prepared model: "
                "create the optimizer from model.parameters() and prepare them together.")
        groups.append([names[id(param)] for param in group["params"]])
    return groups


def by_position(named: dict, names: list[list[str]], live_groups: list) -> dict:
    """A name-keyed optimizer state dict as ``optimizer.state_dict()`` lays it out (state keyed 0, 1, ...); the
    hyperparameters come from the optimizer's own ``live_groups`` (the name-keyed dict turns tuples into lists)."""
    if not named:
        return {}
    flat = [name for group in names for name in group]
    state = {index: named["state"][name] for index, name in enumerate(flat) if name in named["state"]}
    groups, start = [], 0
    for live, group_names in zip(live_groups, names):
        groups.append({**{k: v for k, v in live.items() if k != "params"},
                       "params": list(range(start, start + len(group_names)))})
        start += len(group_names)
    return {"state": state, "param_groups": groups}


def by_name(positional: dict, names: list[list[str]]) -> dict:
    """``optimizer.state_dict()``'s layout keyed by parameter name, as ``set_optimizer_state_dict`` takes it."""
    flat = [name for group in names for name in group]
    state = {flat[int(index)]: value for index, value in positional["state"].items()}
    groups = [{**{k: v for k, v in saved.items() if k != "params"}, "params": list(group_names)}
              for saved, group_names in zip(positional["param_groups"], names)]
    return {"state": state, "param_groups": groups}


def is_shard(value: Any) -> bool:
    """Whether ``value`` is one rank's part of a tensor: a DTensor (FSDP2) or a ShardedTensor (FSDP1)."""
    return hasattr(value, "device_mesh") or type(value).__name__ == "ShardedTensor"


def is_local_state(state: dict) -> bool:
    """Whether an optimizer state holds this rank's shards keyed by name (a sharded checkpoint's): string keys
    and shard values."""
    entries = state.get("state", {})
    return bool(entries) and all(isinstance(key, str) for key in entries) and any(
        is_shard(value) for entry in entries.values() for value in (entry.values() if isinstance(entry, dict) else ()))
