"""The largest never-split layer below each module, memoised so device planning can ask again and again cheaply."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Union

import torch
import torch.nn as nn


class LayerIndex:
    """``best(name, obj)`` -> ``(size, names)``: the largest layer below ``obj`` and the layers of that size.

    A layer is a module without children, a module whose class is in ``no_split``, or a bare tensor. Answers
    are cached per dotted name, so asking about a list of modules costs one lookup per module instead of a
    walk of every subtree (the planner asks after every split).
    """

    def __init__(self, module_sizes: dict[str, float], no_split: list[str]):
        self.sizes = module_sizes
        self.no_split = set(no_split)
        self._memo: dict[str, tuple[float, list[str]]] = {}

    def best(self, name: str, obj: Union[nn.Module, torch.Tensor]) -> tuple[float, list[str]]:
        found = self._memo.get(name)
        if found is not None:
            return found
        children = list(obj.named_children()) if isinstance(obj, nn.Module) else []
        if not children or obj.__class__.__name__ in self.no_split:
            found = (self.sizes.get(name, 0), [name])
        else:
            found = self.over([(f"{name}.{child}", sub) for child, sub in children])
        self._memo[name] = found
        return found

    def over(self, entries: Iterable[tuple[str, Union[nn.Module, torch.Tensor]]],
             modules_only: bool = False) -> tuple[float, list[str]]:
        """Largest layer among ``entries`` (``(name, obj)`` pairs); ``modules_only`` ignores bare tensors."""
        top, names = 0, []
        for name, obj in entries:
            if modules_only and not isinstance(obj, nn.Module):
                continue
            size, layer_names = self.best(name, obj)
            if size > top:
                top, names = size, list(layer_names)
            elif size == top:
                names.extend(layer_names)
        return top, names
