"""``SeedableRandomSampler`` (a shuffle that depends only on a seed and an epoch) and ``get_sampler``."""
from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from .random_order import random_sampler_order

__all__ = ["SeedableRandomSampler", "get_sampler"]

_SEED_MODULUS = 2**64  # torch generators take seeds in [0, 2**64)


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order is a pure function of ``(data_seed, epoch)``.

    Every process that builds it with the same seed shuffles the same way, and a resumed run that restores
    ``epoch`` sees exactly the order of the uninterrupted one. The generator is reseeded with
    ``data_seed + epoch`` at the start of every pass; a completed pass moves to the next epoch, and
    ``set_epoch`` chooses one explicitly.

    Parameters are those of ``RandomSampler`` (``data_source, replacement=False, num_samples=None,
    generator=None``) plus ``data_seed`` (default: ``torch.initial_seed()``).
    """

    def __init__(self, *args: Any, data_seed: Optional[int] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if data_seed is not None and (isinstance(data_seed, bool) or not isinstance(data_seed, int)):
            raise TypeError(f"data_seed must be an int or None, got {data_seed!r}.")
        self.initial_seed = torch.initial_seed() if data_seed is None else data_seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next pass yields."""
        self.epoch = epoch

    def reseeded(self) -> SeedableRandomSampler:
        """Seed the generator for the current epoch (done at the start of every pass); returns the sampler."""
        if self.generator is None:
            self.generator = torch.Generator(device=torch.get_default_device())
        self.generator.manual_seed((self.initial_seed + self.epoch) % _SEED_MODULUS)
        return self

    def __iter__(self):
        self.reseeded()
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def epoch_indices(self) -> list:
        """The whole order of the current epoch, without moving to the next one."""
        return random_sampler_order(self.reseeded())[0].tolist()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "seed": self.initial_seed}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = int(state_dict["epoch"])
        self.initial_seed = int(state_dict["seed"])


def get_sampler(dataloader: DataLoader) -> Optional[Iterable[int]]:
    """The index sampler under a loader's batching (``None`` for an iterable dataset's constant sampler)."""
    if isinstance(dataloader.sampler, BatchSampler):  # a batch sampler given as `sampler=`
        return getattr(dataloader.sampler, "sampler", None)
    if dataloader.batch_sampler is None:  # batch_size=None: the sampler hands out single samples
        return dataloader.sampler
    return getattr(dataloader.batch_sampler, "sampler", None)
