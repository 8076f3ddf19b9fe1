"""A torch ``RandomSampler``'s whole order drawn in one call, and the draw it makes after its last index.

Shared by ``index_order.py`` (the fast path for every known sampler, which needs ``samplers.py``) and
``samplers.py`` (``SeedableRandomSampler.epoch_indices``), so ``samplers.py`` never imports ``index_order.py``.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch.utils.data import RandomSampler

__all__ = ["random_sampler_order", "discard_permutation"]


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
