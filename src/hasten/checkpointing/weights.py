"""A model's weights on their way to a checkpoint file and back.

Saving: the strategy gives the state dict (so sharded backends decide their own format), keyed as the
unwrapped model names its weights, with no ``module.`` from DDP, as the reference library writes: a
checkpoint saved on 8 processes loads on 1 and back. Tied weights (two names, one tensor) are stored once,
under the first name, as the reference and safetensors' own ``save_model`` do.

Loading: keys are matched to the model even when a wrapper's prefix was saved with them (``module.`` from a
DDP model's own ``state_dict()``, ``_orig_mod.`` from ``torch.compile``), and tied names that were stored
once are filled in from their twin before the strategy loads the dict.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping

import torch
from torch import nn

if TYPE_CHECKING:
    from ..core.aliases import NestedData
    from .strategy_protocol import CheckpointingStrategy

__all__ = ["state_dict_for_checkpoint", "drop_aliases", "match_keys", "fill_aliases",
           "prepare_loaded_state"]

logger = logging.getLogger(__name__)

_COMPILED = "_orig_mod"
_DATA_PARALLEL = "module"


def state_dict_for_checkpoint(strategy: CheckpointingStrategy, model: nn.Module) -> dict:
    """The model's state dict as the strategy gives it (keys of the unwrapped model, as the reference writes)."""
    return dict(strategy.model_state_dict(model))


PLAIN_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})  # no device mesh: answered without looking


def _alias_key(tensor: torch.Tensor):
    """Equal for two names of one tensor (same memory, same view), different otherwise."""
    if tensor.is_meta or tensor.numel() == 0:
        return None
    if type(tensor) not in PLAIN_TENSOR_TYPES and hasattr(tensor, "device_mesh"):  # a DTensor (a sharded
        return ("distributed", id(tensor))  # backend's parameter): tied names share the object
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.dtype,
            tuple(tensor.shape), tuple(tensor.stride()))


def drop_aliases(state: Mapping[str, torch.Tensor]) -> tuple[dict, dict]:
    """``(kept, aliases)``: every tensor once under its first name; ``aliases`` maps each dropped name to it."""
    first: dict = {}
    kept, aliases = {}, {}
    for name, tensor in state.items():
        key = _alias_key(tensor) if isinstance(tensor, torch.Tensor) else None
        if key is not None and key in first:
            aliases[name] = first[key]
            continue
        if key is not None:
            first[key] = name
        kept[name] = tensor
    if aliases:
        logger.info("Tied weights stored once: %s", ", ".join(f"{a} -> {b}" for a, b in aliases.items()))
    return kept, aliases


def _canonical(key: str, strip_data_parallel: int) -> str:
    parts = [part for part in key.split(".") if part != _COMPILED]
    return ".".join(parts[strip_data_parallel:])


def _leading_wrappers(keys: Iterable[str]) -> int:
    """How many ``module.`` levels every key starts with (DDP wrappers, possibly nested)."""
    keys = [[part for part in key.split(".") if part != _COMPILED] for key in keys]
    depth = 0
    while keys and all(len(parts) > depth + 1 and parts[depth] == _DATA_PARALLEL for parts in keys):
        depth += 1
    return depth


def match_keys(loaded: Mapping, expected_keys: Iterable[str]) -> dict:
    """``loaded`` with its keys renamed to the model's when they differ only by wrapper prefixes."""
    expected_keys = list(expected_keys)
    if set(loaded) <= set(expected_keys):
        return dict(loaded)
    loaded_depth, expected_depth = _leading_wrappers(loaded), _leading_wrappers(expected_keys)
    extra = loaded_depth - expected_depth
    if extra < 0:
        extra = 0
    targets = {}
    for key in expected_keys:
        targets.setdefault(_canonical(key, 0), []).append(key)
    renamed = {}
    for key, value in loaded.items():
        candidates = targets.get(_canonical(key, extra), [])
        renamed[candidates[0] if len(candidates) == 1 else key] = value
    if len(renamed) != len(loaded):  # two saved names mapped to one model name: keep the file's names
        return dict(loaded)
    return renamed


def fill_aliases(loaded: dict, expected: Mapping[str, torch.Tensor]) -> dict:
    """Add the tied names the file stored once: a missing name gets the tensor of the name it is tied to."""
    groups: dict = {}
    for name, tensor in expected.items():
        key = _alias_key(tensor) if isinstance(tensor, torch.Tensor) else None
        if key is not None:
            groups.setdefault(key, []).append(name)
    for names in groups.values():
        if len(names) < 2:
            continue
        present = [name for name in names if name in loaded]
        if present:
            for name in names:
                loaded.setdefault(name, loaded[present[0]])
    return loaded


def prepare_loaded_state(strategy: CheckpointingStrategy, model: nn.Module, loaded: Mapping) -> dict:
    """A state dict read from a file, made ready for ``strategy.load_model_state_dict(model, ...)``."""
    expected = strategy.expected_state_dict(model, keep_vars=True)
    return fill_aliases(match_keys(loaded, expected.keys()), expected)


def flatten_names(state: NestedData, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor of a nested state, named as torch.distributed.checkpoint flattens it
    (keys and list positions joined with dots)."""
    if isinstance(state, torch.Tensor):
        yield prefix, state
    elif isinstance(state, dict):
        for key, value in state.items():
            yield from flatten_names(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(state, (list, tuple)):
        for index, value in enumerate(state):
            yield from flatten_names(value, f"{prefix}.{index}" if prefix else str(index))
