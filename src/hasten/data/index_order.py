"""A whole epoch's sample order, computed in one call for the samplers whose order is known.

Sharding and resuming then cost one slice per batch instead of walking every index of every process,
and starting at batch ``k`` is as cheap as starting at batch 0. Only samplers whose iteration has no effect
other than producing the order (the torch built-ins) are recognised; any other sampler is walked as usual.
"""
from __future__ import annotations

import sys
from typing import Callable, Iterable, Optional, Sequence

from torch.utils.data import (BatchSampler, DistributedSampler, RandomSampler, SequentialSampler,
                              SubsetRandomSampler, WeightedRandomSampler)

from .random_order import _CHEAP_DISCARD, discard_permutation, random_sampler_order  # noqa: F401  (also importable here)
from .samplers import SeedableRandomSampler

__all__ = ["epoch_order", "has_known_batching", "discard_permutation"]

# Samplers whose order is exactly ``list(sampler)``, drawn with the same generator calls as lazy iteration.
_LISTABLE = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler, DistributedSampler)


def _torchdata_class(name: str):
    module = sys.modules.get("torchdata.stateful_dataloader.sampler")  # only if the user already imported it
    return getattr(module, name, None) if module is not None else None


def has_known_batching(batch_sampler: Iterable[list[int]]) -> bool:
    """Whether ``batch_sampler`` cuts its sampler's order into consecutive ``batch_size`` chunks."""
    kind = type(batch_sampler)
    if kind.__iter__ is BatchSampler.__iter__:
        return _sampler_kind(batch_sampler.sampler) is not None
    torchdata_batch_sampler = _torchdata_class("BatchSampler")
    return (torchdata_batch_sampler is not None and kind is torchdata_batch_sampler
            and _sampler_kind(batch_sampler.sampler) is not None)


def _sampler_kind(sampler) -> Optional[str]:
    kind = type(sampler)
    if kind is SequentialSampler:
        return "range"
    if kind is SeedableRandomSampler:
        return "seedable"
    if kind is RandomSampler:
        return "random"
    if kind in _LISTABLE or (kind is _torchdata_class("RandomSampler") and kind is not None):
        return "list"
    return None


def epoch_order(sampler: Iterable[int]) -> tuple[Sequence[int], Optional[Callable[[], None]]]:
    """The indices ``sampler`` yields in its next pass (call only when ``has_known_batching`` said yes) as a
    range, list or 1-d tensor, and a
    function to call when that pass is complete (it does what the sampler does after its last index: draw
    what it draws then, or move a ``SeedableRandomSampler`` to its next epoch), or None.
    """
    kind = _sampler_kind(sampler)
    if kind == "range":
        return range(len(sampler.data_source)), None
    if kind == "seedable":
        order, _ = random_sampler_order(sampler.reseeded())  # reseeded every epoch: no draw left to make
        return order, lambda: sampler.set_epoch(sampler.epoch + 1)
    if kind == "random":
        return random_sampler_order(sampler)
    return list(sampler), None
