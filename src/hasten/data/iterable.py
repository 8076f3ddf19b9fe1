"""``IterableDatasetShard``: one process's share of the samples of an ``IterableDataset``.

Every process reads the same stream, cuts it in global batches and keeps its own part of each: a whole
per-process batch (``split_batches=False``) or a slice of the batch (``split_batches=True``). Unless
``drop_last``, the last global batch is completed with samples from the first one.

When the wrapped dataset has its own ``state_dict()``/``load_state_dict()``, the shard has them too, so a
resumed run continues from the saved position instead of replaying the stream.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch.utils.data import IterableDataset

from .validation import check_process_layout, check_split_batch_size

__all__ = ["IterableDatasetShard", "has_own_state"]


def has_own_state(obj: Any) -> bool:
    """Whether ``obj`` saves and restores its own position (the ``state_dict``/``load_state_dict`` pair)."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


class IterableDatasetShard(IterableDataset):
    """Yield only the samples of ``dataset`` that belong to ``process_index``.

    Parameters:
        dataset: the iterable dataset to share out.
        batch_size: per-process batch size (``split_batches=False``) or global batch size (``True``, where it
            must be a multiple of ``num_processes``).
        drop_last: drop the last incomplete global batch instead of completing it with samples from the start.
        num_processes, process_index: how many processes share the stream and which one this is.
        split_batches: cut each global batch of ``batch_size`` samples in ``num_processes`` slices.
    """

    def __new__(cls, *args, **kwargs):
        dataset = args[0] if args else kwargs.get("dataset")
        if cls is IterableDatasetShard and dataset is not None and has_own_state(dataset):
            cls = StatefulIterableDatasetShard
        return super().__new__(cls)

    def __init__(self, dataset: IterableDataset, batch_size: int = 1, drop_last: bool = False,
                 num_processes: int = 1, process_index: int = 0, split_batches: bool = False):
        check_process_layout(num_processes, process_index, "IterableDatasetShard")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"IterableDatasetShard: batch_size must be an int >= 1, got {batch_size!r}.")
        if split_batches:
            check_split_batch_size(batch_size, num_processes, "IterableDatasetShard(split_batches=True)")
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0
        generator = getattr(dataset, "generator", None)
        self._base_seed = generator.initial_seed() if isinstance(generator, torch.Generator) else None

    # ------------------------------------------------------------------ sizes
    @property
    def global_batch_size(self) -> int:
        """Samples all processes take together in one step."""
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def process_batch_size(self) -> int:
        """Samples this process takes from each global batch."""
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    @property
    def total_length(self) -> int:
        """Samples of the wrapped dataset (raises ``TypeError`` when it has no length)."""
        return len(self.dataset)

    def __len__(self) -> int:
        batches = len(self.dataset) / self.global_batch_size
        return (math.floor(batches) if self.drop_last else math.ceil(batches)) * self.process_batch_size

    def last_global_batch_real_samples(self) -> int:
        """Real (not repeated) samples in the last global batch; -1 when the dataset has no length."""
        try:
            count = len(self.dataset)
        except TypeError:
            return -1
        total = self.global_batch_size
        if self.drop_last:
            return total if count >= total else 0
        return count % total or (total if count else 0)

    # ------------------------------------------------------------------ epochs
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch; forwarded to the dataset when it takes one."""
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def _seed_dataset_generator(self) -> None:
        # A dataset that shuffles with its own `generator` (and has no set_epoch) must shuffle the same way on
        # every process, and differently each epoch: reseed it from its original seed and the epoch.
        if self._base_seed is not None and not hasattr(self.dataset, "set_epoch"):
            self.dataset.generator.manual_seed((self._base_seed + self.epoch) % 2**64)

    # ------------------------------------------------------------------ iteration
    def __iter__(self):
        self._seed_dataset_generator()
        yield from self._share(iter(self.dataset), first_batch=None)

    def _share(self, samples, first_batch: Optional[list]):
        """This process's samples of the global batches read from ``samples``."""
        size = self.global_batch_size
        mine = range(self.process_index * self.process_batch_size, (self.process_index + 1) * self.process_batch_size)
        batch = []
        for sample in samples:
            batch.append(sample)
            if len(batch) == size:
                if first_batch is None:
                    first_batch = list(batch)
                self._batch_read(batch, first_batch)
                for position in mine:
                    yield batch[position]
                batch = []
        if self.drop_last or not batch:
            self._stream_ended()
            return
        if first_batch is None:
            first_batch = list(batch)
        while len(batch) < size:
            batch += first_batch[: size - len(batch)]
        self._batch_read(batch, first_batch, last=True)
        for position in mine:
            yield batch[position]

    def _batch_read(self, batch: list, first_batch: list, last: bool = False) -> None:
        """Hook: a global batch was just read (the stateful shard records its position here)."""

    def _stream_ended(self) -> None:
        """Hook: the wrapped dataset has no more samples for this pass."""


class StatefulIterableDatasetShard(IterableDatasetShard):
    """The shard of a dataset with its own ``state_dict``: saves and restores its position without replaying.

    The state holds the dataset's state after the last global batch read, the first global batch (to
    complete the last one) and this process's samples of the current global batch not yielded yet.
    ``IterableDatasetShard(dataset)`` returns this class when the dataset qualifies.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._resume: Optional[dict] = None
        # (dataset state, first global batch, my samples of the current one, whether the stream has ended)
        self._saved: Optional[tuple] = None
        self._yielded_of_saved = 0

    def _batch_read(self, batch: list, first_batch: list, last: bool = False) -> None:
        start = self.process_index * self.process_batch_size
        self._saved = (self.dataset.state_dict(), first_batch, batch[start:start + self.process_batch_size], last)
        self._yielded_of_saved = 0

    def _stream_ended(self) -> None:
        if self._saved is not None:
            self._saved = self._saved[:3] + (True,)

    def __iter__(self):
        resume, self._resume = self._resume, None
        self._saved, self._yielded_of_saved = None, 0
        if resume is None:
            samples = super().__iter__()
        else:
            self.dataset.load_state_dict(resume["dataset"])
            self._saved = (resume["dataset"], resume["first_batch"], list(resume["pending"]), resume["ended"])
            samples = self._resumed(resume)
        for sample in samples:
            self._yielded_of_saved += 1
            yield sample

    def _resumed(self, resume: dict):
        yield from resume["pending"]
        if not resume["ended"]:
            yield from self._share(iter(self.dataset), first_batch=resume["first_batch"])

    def state_dict(self) -> dict:
        if self._resume is not None:  # restored but not iterated yet
            return dict(self._resume)
        if self._saved is None:
            return {"epoch": self.epoch, "dataset": self.dataset.state_dict(), "first_batch": None, "pending": [],
                    "ended": False}
        dataset_state, first_batch, mine, ended = self._saved
        return {"epoch": self.epoch, "dataset": dataset_state, "first_batch": first_batch,
                "pending": mine[self._yielded_of_saved:], "ended": ended}

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next pass continue from ``state_dict`` (taken by ``state_dict()``)."""
        self.epoch = state_dict["epoch"]
        self._resume = dict(state_dict)
