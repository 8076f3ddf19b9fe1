"""A whole epoch's sample order, computed in one call for the samplers whose order is known.

Sharding and resuming then cost one slice per batch instead of walking every index of every process,
and starting at batch ``k`` is as cheap as starting at batch 0. Only samplers whose iteration has no effect
other than producing the order (the torch built-ins) are recognised; any other sampler is walked as usual.
"""
from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence

import torch
from torch.utils.data import (BatchSampler, DistributedSampler, RandomSampler, SequentialSampler,
                              SubsetRandomSampler, WeightedRandomSampler)

from .samplers import SeedableRandomSampler

__all__ = ["epoch_order", "has_known_batching", "discard_permutation"]

# Samplers whose order is exactly ``list(sampler)``, drawn with the same generator calls as lazy iteration.
_LISTABLE = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler, DistributedSampler)


def _torchdata_class(name: str):
    module = sys.modules.get("torchdata.stateful_dataloader.sampler")  # only if the user already imported it
    return getattr(module, name, None) if module is not None else None


def has_known_batching(batch_sampler) -> bool:
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


def epoch_order(sampler) -> tuple[Sequence[int], Optional[Callable[[], None]]]:
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


def random_sampler_order(sampler: RandomSampler) -> tuple[torch.Tensor, Optional[Callable[[], None]]]:
    """What ``list(sampler)`` gives for a torch ``RandomSampler``, as a tensor, drawn with the same generator calls.

    Walking the sampler's generator one index at a time, or even turning the whole permutation into Python
    ints, costs more than the rest of the sharding; batches are taken from the tensor instead.

    Also returns the draw the sampler makes only after its last index (a permutation it takes nothing from),
    to be made when the pass is complete, as lazy iteration would; None when there is none.
    """
    count, total = len(sampler.data_source), sampler.num_samples
    generator = sampler.generator
    if generator is None:
        generator = torch.Generator()
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    if sampler.replacement:
        parts = [torch.randint(high=count, size=(32,), dtype=torch.int64, generator=generator)
                 for _ in range(total // 32)]
        parts.append(torch.randint(high=count, size=(total % 32,), dtype=torch.int64, generator=generator))
        return torch.cat(parts), None
    parts = [torch.randperm(count, generator=generator) for _ in range(total // count)]
    if total % count == 0:
        order = parts[0] if len(parts) == 1 else torch.cat(parts)
        return order, lambda: discard_permutation(count, generator)
    parts.append(torch.randperm(count, generator=generator)[: total % count])
    return torch.cat(parts), None


# Permutation sizes for which a cheaper draw was checked to leave a CPU generator as torch.randperm does.
_CHEAP_DISCARD: dict = {}


def discard_permutation(count: int, generator: torch.Generator) -> None:
    """Move ``generator`` on exactly as ``torch.randperm(count, generator=generator)`` would, result unused.

    ``RandomSampler`` draws such a permutation after its last index; building it costs as much as the epoch's
    real one. On the CPU, randperm draws one 32-bit number per position but the first; a draw of as many numbers
    in a range of one value consumes the same numbers at a fraction of the cost. That equivalence is checked once
    per size (on scratch generators, so any torch version that differs falls back to randperm itself)."""
    if count > 1 and generator.device.type == "cpu" and _cheap_discard_matches(count):
        _cheap_discard(count, generator)
    else:
        torch.randperm(count, generator=generator)


def _cheap_discard(count: int, generator: torch.Generator) -> None:
    torch.randint(0, 1, (count - 1,), generator=generator, dtype=torch.int32)


def _cheap_discard_matches(count: int) -> bool:
    matches = _CHEAP_DISCARD.get(count)
    if matches is None:
        reference, candidate = torch.Generator(), torch.Generator()
        reference.manual_seed(0x5EED)
        candidate.manual_seed(0x5EED)
        torch.randperm(count, generator=reference)
        _cheap_discard(count, candidate)
        matches = _CHEAP_DISCARD[count] = torch.equal(reference.get_state(), candidate.get_state())
    return matches
