"""Type aliases the signatures of several rooms share, so each is written (and explained) once.

Nothing here is imported at run time beyond ``typing``: the aliases only name types for readers and type checkers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import torch

__all__ = ["Device", "NestedData"]

# A device as the API takes it: an accelerator index (0, 1, ...), a device string ("cpu", "cuda:1"; a device map
# also says "disk" and "meta") or a ``torch.device``.
Device = Union[int, str, "torch.device"]

# Nested data as the collectives and loaders take and return it: a leaf (a tensor, usually; other leaves pass
# through) or lists, tuples, namedtuples and mappings of such data, to any depth. An alias of Any, named for readers:
# Python's types cannot say "tensors nested to any depth" without also fixing what every leaf may be.
NestedData = Any
