"""A readable name for any object (a tracker's or a config's class, a function)."""
from __future__ import annotations

from typing import Any

__all__ = ["get_pretty_name"]


def get_pretty_name(obj: Any) -> str:
    """A readable name for ``obj``: its ``__qualname__``/``__name__``, or that of its class."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    if hasattr(obj, "__qualname__"):
        return obj.__qualname__
    if hasattr(obj, "__name__"):
        return obj.__name__
    return str(obj)
