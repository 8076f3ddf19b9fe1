"""Walking nested data (lists, tuples, namedtuples, mappings): the pieces the collectives and their agreement
checks both need, so neither has to import the other."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .aliases import NestedData

__all__ = ["is_namedtuple", "honor_type", "leaves", "merge_dicts"]


def is_namedtuple(data: Any) -> bool:
    """Whether ``data`` is a namedtuple instance (a tuple with ``_fields`` and ``_asdict``)."""
    return isinstance(data, tuple) and hasattr(data, "_fields") and hasattr(data, "_asdict")


def honor_type(obj: tuple | list, generator: Iterable[Any]) -> tuple | list:
    """Build a container of ``obj``'s type (list, tuple, namedtuple, other tuple subclass) from ``generator``."""
    items = list(generator)
    if is_namedtuple(obj):
        return type(obj)(*items)
    return type(obj)(items)


def leaves(data: NestedData, out: list) -> list:
    """Append every non-container leaf of ``data`` to ``out``, in ``recursively_apply`` order."""
    if isinstance(data, (tuple, list)):
        for item in data:
            leaves(item, out)
    elif isinstance(data, Mapping):
        for value in data.values():
            leaves(value, out)
    else:
        out.append(data)
    return out


def merge_dicts(source: dict, destination: dict) -> dict:
    """Merge ``source`` into ``destination`` recursively (nested dicts merged, other values replaced);
    returns ``destination``."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination
