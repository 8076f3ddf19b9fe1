"""What ``Accelerator.log`` accepts: numbers, strings and one-element tensors (made plain Python numbers).

Checked before any tracker sees the values, so a bad entry fails the whole call with its key named and no
tracker has logged half of it. A dict of such values is accepted too (TensorBoard logs it as grouped scalars).
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

__all__ = ["prepare_log_values", "prepare_config"]


def _scalar(key: str, value):
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Real):  # int, float, numpy scalars
        return value.item() if hasattr(value, "item") else value
    if hasattr(value, "numel") or (hasattr(value, "size") and hasattr(value, "item")):  # torch / numpy arrays
        count = value.numel() if hasattr(value, "numel") else value.size
        if count != 1:
            raise ValueError(f"Cannot log {key!r}: it is a tensor of {count} elements, and trackers log one number "
                             "per key. Log a reduction (e.g. loss.mean().item()) or one key per element.")
        return value.item() if not hasattr(value, "detach") else value.detach().cpu().item()
    if isinstance(value, Mapping):
        return {sub: _scalar(f"{key}/{sub}", inner) for sub, inner in _items(value, key)}
    raise TypeError(f"Cannot log {key!r}: its value has type {type(value).__name__}; log numbers, strings or "
                    "tensors of one element (for images and tables use get_tracker(name).log_images / log_table).")


def _items(values: Mapping, where: str):
    for key, value in values.items():
        if not isinstance(key, str):
            raise TypeError(f"Cannot log {where}: its key {key!r} is a {type(key).__name__}, keys must be strings.")
        yield key, value


def prepare_log_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` checked and converted: one-element tensors and numpy scalars become Python numbers."""
    if not isinstance(values, Mapping):
        raise TypeError(f"Accelerator.log takes a dict of name -> value, got {type(values).__name__}.")
    return {key: _scalar(key, value) for key, value in _items(values, "the values")}


def prepare_config(config: Any) -> dict[str, Any]:
    """The run's configuration as plain values: a dict (or an object with ``__dict__`` such as argparse's
    Namespace); tensors of one element become numbers, anything else that is not a plain value becomes its str."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        if not hasattr(config, "__dict__"):
            raise TypeError(f"init_trackers(config=...) takes a dict, got {type(config).__name__}.")
        config = vars(config)

    def plain(value):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        try:
            return _scalar("config", value)
        except (TypeError, ValueError):
            return str(value)

    return {str(key): plain(value) for key, value in config.items()}
