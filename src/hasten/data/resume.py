"""Resuming mid-epoch: ``skip_first_batches`` and the compatibility classes ``SkipBatchSampler`` / ``SkipDataLoader``.

The skip applies to the first pass only: the next epoch starts at its first batch again. For map-style
data the skipped batches are never loaded: the batch sampler starts at the right batch, which for the
torch samplers is a slice of the epoch's order (the same cost whether 10 or 100,000 batches are skipped).
An iterable dataset that has its own ``state_dict`` resumes from it (see ``DataLoader.load_state_dict``);
otherwise its skipped batches have to be read and dropped.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset

from .batch_shard import BatchSamplerShard, SampleShard, positioned
from .dispatcher import DataLoaderDispatcher
from .loader_core import PreparedDataLoader, loader_options
from .samplers import get_sampler
from .shard_loader import DataLoaderShard
from .validation import check_non_negative_int

__all__ = ["skip_first_batches", "SkipBatchSampler", "SkipDataLoader"]

class SkipBatchSampler(BatchSamplerShard):
    """``batch_sampler`` whose first pass starts after ``skip_batches`` batches (later passes are whole)."""

    def __init__(self, batch_sampler: Iterable[list[int]], skip_batches: int = 0):
        super().__init__(batch_sampler, num_processes=1, process_index=0, even_batches=False)
        self.skip_batches = check_non_negative_int(skip_batches, "skip_batches")
        self.start_at(skip_batches)

    def __len__(self) -> int:
        return max(0, super().__len__() - self._next_start)


class SkipDataLoader(DataLoaderShard):
    """A ``DataLoader`` whose first pass skips ``skip_batches`` batches (``skip_first_batches`` is preferred).

    ``iteration`` (the epoch its passes set on the sampler and dataset) defaults to the epoch the sampler,
    batch sampler or dataset is at, so wrapping a loader never moves its shuffle back to epoch 0.
    """

    def __init__(self, dataset: Dataset, skip_batches: int = 0, use_stateful_dataloader: bool = False,
                 iteration: Optional[int] = None, **kwargs: Any):
        if not isinstance(dataset, IterableDataset) and kwargs.get("batch_sampler") is None \
                and not isinstance(kwargs.get("sampler"), BatchSampler):
            kwargs = _with_positioned_batch_sampler(dataset, kwargs)
        super().__init__(dataset, skip_batches=skip_batches, use_stateful_dataloader=use_stateful_dataloader,
                         iteration=0 if iteration is None else iteration, **kwargs)
        if iteration is None:
            self.iteration = _current_epoch(self)


def _current_epoch(loader: DataLoader) -> int:
    """The epoch the loader's sampler, batch sampler or dataset was last set to (0 when none keeps one)."""
    batching = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    candidates = (get_sampler(loader), getattr(batching, "batch_sampler", None), batching, loader.dataset,
                  getattr(loader.dataset, "dataset", None))
    for candidate in candidates:
        epoch = getattr(candidate, "epoch", None)
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            return epoch
    return 0


def _with_positioned_batch_sampler(dataset, kwargs: dict) -> dict:
    """DataLoader options with the batching turned into a ``BatchSamplerShard`` (so skipping costs nothing)."""
    if kwargs.get("generator") is None:  # the shuffle must not draw from torch's global generator
        kwargs["generator"] = torch.Generator()
        kwargs["generator"].manual_seed(torch.initial_seed())
    probe = DataLoader(dataset, batch_size=kwargs.pop("batch_size", 1), shuffle=kwargs.pop("shuffle", None),
                       sampler=kwargs.pop("sampler", None), drop_last=kwargs.pop("drop_last", False),
                       generator=kwargs["generator"])
    if probe.batch_sampler is None:  # batch_size=None: each sample is a batch
        kwargs.update(sampler=SampleShard(probe.sampler, 1, 0, even_batches=False), batch_size=None)
        return kwargs
    kwargs["batch_sampler"] = positioned(probe.batch_sampler)
    return kwargs


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader like ``dataloader`` whose first pass starts after ``num_batches`` batches.

    Use it to resume mid-epoch. Later passes (epochs) are complete. The returned loader continues the
    original's epoch count. Map-style data is skipped without loading the skipped samples.
    """
    check_non_negative_int(num_batches, "num_batches")
    if isinstance(dataloader, PreparedDataLoader):
        return _skipping_copy(dataloader, num_batches)
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"skip_first_batches takes a DataLoader, got {type(dataloader).__name__}.")
    options = loader_options(dataloader, stateful=False)
    if isinstance(dataloader.dataset, IterableDataset):
        return SkipDataLoader(dataloader.dataset, skip_batches=num_batches, batch_size=dataloader.batch_size,
                              drop_last=dataloader.drop_last, **options)
    if isinstance(dataloader.sampler, BatchSampler):
        batching = {"sampler": positioned(dataloader.sampler),
                    "batch_size": dataloader.batch_size}
    elif dataloader.batch_sampler is not None:
        batching = {"batch_sampler": positioned(dataloader.batch_sampler)}
    else:
        batching = {"sampler": SampleShard(dataloader.sampler, 1, 0, even_batches=False), "batch_size": None}
    return SkipDataLoader(dataloader.dataset, skip_batches=num_batches, **batching, **options)


def _skipping_copy(loader: PreparedDataLoader, num_batches: int) -> PreparedDataLoader:
    """A new prepared loader sharing ``loader``'s dataset, sampling and settings, starting later."""
    clone = loader.__class__.__new__(loader.__class__)
    clone.__dict__.update(loader.__dict__)
    clone._iterator = None  # never share a live iterator (or its worker processes)
    clone.skip_batches = num_batches
    clone._pending_skip = clone._length_skip = num_batches
    clone._pass_skip = clone._position = clone._replay = 0
    clone._pending_base_state = clone._pending_dataset_state = clone._loaded_state = None
    clone._lookahead_state = {}
    if hasattr(clone, "next_iter_state"):  # StatefulDataLoader: start from scratch, then skip
        clone.next_iter_state, clone._initial_iter_for_state_dict = None, False
    clone.end_of_dataloader, clone.remainder = False, -1
    if isinstance(loader, DataLoaderDispatcher):
        clone._pending_first_samples = None
    # The copy plays the pass the original was about to play: it takes over the original's pending resume,
    # the original follows the copy's epoch, and reports the copy's position while the copy is mid-pass.
    loader._pending_skip = loader._length_skip = 0
    loader._pending_base_state = loader._pending_dataset_state = loader._loaded_state = None
    clone._origin = loader
    return clone
