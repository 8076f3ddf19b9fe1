"""``BatchSamplerShard``: one process's share of the batches of a batch sampler.

All processes walk the same global batch stream (same sampler, same seed) and each keeps its own share:
whole batches in turn (``split_batches=False``) or a slice of every batch (``split_batches=True``). With
``even_batches`` the stream is completed with indices from its start so every process gets as many full
batches as the others; otherwise the last batches may be missing or short on some processes.

The shard also knows its position: ``state_dict()`` says how many batches the current pass has produced and
``load_state_dict()`` (or ``start_at``) makes the next pass start there. For the torch built-in samplers the
start is reached by slicing the epoch's order, without walking the skipped batches.
"""
from __future__ import annotations

import itertools
import math
from typing import Iterable, Iterator, Optional

import torch
from torch.utils.data import BatchSampler

from .index_order import epoch_order, has_known_batching
from .samplers import SeedableRandomSampler
from .validation import check_process_layout, check_split_batch_size

__all__ = ["BatchSamplerShard", "SampleShard", "positioned"]


class BatchSamplerShard(BatchSampler):
    """Yield only the batches (or batch slices) of ``batch_sampler`` that belong to ``process_index``.

    Parameters:
        batch_sampler: the batch sampler to share out (``BatchSampler`` or any iterable of index lists).
        num_processes, process_index: how many processes share it and which one this is.
        split_batches: ``False``: process ``i`` gets batches ``i, i + n, i + 2n, ...``; ``True``: every batch is
            cut in ``n`` equal slices (its batch size must be a multiple of ``n``).
        even_batches: complete the end of the stream with indices from its start so that all processes get
            the same number of full batches (ignored when the batch sampler drops its last batch).
    """

    def __init__(self, batch_sampler: Iterable[list[int]], num_processes: int = 1, process_index: int = 0,
                 split_batches: bool = False, even_batches: bool = True):
        check_process_layout(num_processes, process_index, "BatchSamplerShard")
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        if split_batches:
            check_split_batch_size(self.batch_size, num_processes, "BatchSamplerShard(split_batches=True)")
        self._next_start = 0  # batches the next pass skips (one pass only)
        self._position = 0  # batches the current pass has produced, counting the skipped ones

    # ------------------------------------------------------------------ torch.utils.data compatibility
    @property
    def sampler(self) -> Optional[Iterable[int]]:
        """The index sampler under the wrapped batch sampler."""
        return getattr(self.batch_sampler, "sampler", None)

    @sampler.setter
    def sampler(self, sampler: Iterable[int]) -> None:
        self.batch_sampler.sampler = sampler

    @property
    def total_length(self) -> int:
        """Batches of the wrapped batch sampler (all processes together)."""
        return len(self.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the batch sampler and its sampler (those that take one)."""
        for target in (self.batch_sampler, self.sampler):
            if hasattr(target, "set_epoch"):
                target.set_epoch(epoch)

    # ------------------------------------------------------------------ length
    def _sample_count(self) -> Optional[int]:
        """Indices the wrapped batch sampler yields in a pass, when knowable without iterating."""
        try:
            count = len(self.sampler)
        except TypeError:
            return None
        if self.batch_size is None:
            return None
        return (count // self.batch_size) * self.batch_size if self.drop_last else count

    def __len__(self) -> int:
        batches = len(self.batch_sampler)
        if self.split_batches:
            if self.drop_last or self.even_batches:
                return batches
            count = self._sample_count()
            if count is None or count % self.batch_size == 0:
                return batches
            last_size = count - (batches - 1) * self.batch_size
            owns_slice = last_size > (self.batch_size // self.num_processes) * self.process_index
            return batches - 1 + int(owns_slice)
        rounds, extra = divmod(batches, self.num_processes)
        if self.drop_last or extra == 0:
            return rounds
        if self.even_batches:
            return rounds + 1
        return rounds + int(self.process_index < extra)

    def last_global_batch_real_samples(self) -> int:
        """Real (not repeated) samples in the last global batch of a pass; -1 when not knowable in advance.

        The global batch is what all processes take together in one step: ``batch_size * num_processes``
        samples, or ``batch_size`` with ``split_batches``.
        """
        count = self._sample_count()
        if count is None:
            return -1
        total = self.batch_size if self.split_batches else self.batch_size * self.num_processes
        if count < (total if self.drop_last else 1):
            return 0
        return total if self.drop_last else (count % total or total)

    # ------------------------------------------------------------------ position
    def start_at(self, batches: int) -> None:
        """Make the next pass begin with this process's batch number ``batches`` (0-based)."""
        if not isinstance(batches, int) or isinstance(batches, bool) or batches < 0:
            raise ValueError(f"The number of batches to skip must be an int >= 0, got {batches!r}.")
        self._next_start = batches

    def state_dict(self) -> dict:
        """Position of the current pass (and the seedable sampler's epoch and seed)."""
        state = {"batches_yielded": self._position}
        if isinstance(self.sampler, SeedableRandomSampler):
            state["sampler"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next pass resume where ``state_dict`` was taken."""
        if "sampler" in state_dict and isinstance(self.sampler, SeedableRandomSampler):
            self.sampler.load_state_dict(state_dict["sampler"])
        self.start_at(int(state_dict["batches_yielded"]))

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[list]:
        start, self._next_start = self._next_start, 0
        self._position = start
        if has_known_batching(self.batch_sampler):
            batches = self._from_order(start)
        else:
            batches = itertools.islice(self._walk(), start, None)
        for batch in batches:
            self._position += 1
            yield batch

    def _from_order(self, start: int) -> Iterator[list]:
        """The shard computed by slicing the epoch's order (same batches as ``_walk``, no walking)."""
        order, when_complete = epoch_order(self.sampler)
        size, processes, index = self.batch_size, self.num_processes, self.process_index
        count = len(order)
        global_batches = count // size if self.drop_last else math.ceil(count / size)
        if self.split_batches:
            total = global_batches
            pad_source = order[:size]
        elif self.drop_last:
            total = (global_batches // processes) * processes
            pad_source = ()
        elif self.even_batches:
            total = math.ceil(global_batches / processes) * processes
            pad_source = order[:processes * size]
        else:
            total = global_batches
            pad_source = ()
        padding = _cycled(_as_list(pad_source), max(0, total * size - count) if self.even_batches else 0)
        indices = _Indices(order)

        def take(begin: int, end: int) -> list:
            if end <= count:
                return indices.take(begin, end)
            return indices.take(begin, count) + padding[max(0, begin - count):end - count]

        if self.split_batches:
            width = size // processes
            offset = width * index
            for number in range(start, total):
                begin = number * size + offset
                batch = take(begin, min(begin + width, count + len(padding)))
                if batch:
                    yield batch
        else:
            for number in range(start * processes + index, total, processes):
                yield take(number * size, (number + 1) * size)
        if when_complete is not None:
            when_complete()

    def _walk(self) -> Iterator[list]:
        """The shard computed by iterating the global batch stream (any batch sampler)."""
        return self._walk_split() if self.split_batches else self._walk_whole()

    def _walk_split(self) -> Iterator[list]:
        size = self.batch_size
        width = size // self.num_processes
        mine = slice(width * self.process_index, width * (self.process_index + 1))
        first = last = None
        for batch in self.batch_sampler:
            if first is None:
                first = batch
            last = batch
            if len(batch) == size:
                yield batch[mine]
        if self.drop_last or not first or len(last) >= size:
            return
        if self.even_batches:
            yield (list(last) + _cycled(first, size - len(last)))[mine]
        elif len(last) > mine.start:
            yield last[mine]

    def _walk_whole(self) -> Iterator[list]:
        size, processes, index = self.batch_size, self.num_processes, self.process_index
        keep_start = not self.drop_last and self.even_batches
        start_batches = []  # the first `processes` batches: the material to complete the stream with
        mine = last = None
        count = 0
        for number, batch in enumerate(self.batch_sampler):
            count, last = number + 1, batch
            if keep_start and number < processes:
                start_batches.append(batch)
            if number % processes == index:
                mine = batch
            if number % processes == processes - 1 and (size is None or len(batch) == size):
                yield mine
                mine = None
        if self.drop_last or count == 0:
            return
        if not self.even_batches:
            if mine:
                yield mine
            return
        if mine and (size is None or len(mine) == size):
            yield mine
        if size is None:  # batches of unknown size: complete the round with whole batches from the start
            fillers = itertools.cycle(start_batches)
            for number in range(count, math.ceil(count / processes) * processes):
                filler = next(fillers)
                if number % processes == index:
                    yield filler
            return
        pool = [sample for batch in start_batches for sample in batch]
        total = math.ceil(count / processes) * processes
        short = size - len(last) if len(last) < size else 0
        padding = _cycled(pool, short + (total - count) * size)
        if short and (count - 1) % processes == index:
            yield list(last) + padding[:short]
        used = short
        for number in range(count, total):
            if number % processes == index:
                yield padding[used:used + size]
            used += size


def positioned(batch_sampler: Iterable[list[int]]) -> BatchSamplerShard:
    """``batch_sampler``'s batches unchanged (one process, nothing repeated), able to start at any batch."""
    return BatchSamplerShard(batch_sampler, 1, 0, even_batches=False)


class SampleShard(BatchSamplerShard):
    """One process's samples of ``sampler``, one at a time: the shard of a loader without automatic batching
    (``batch_size=None``), where each sample is its own batch."""

    def __init__(self, sampler: Iterable[int], num_processes: int = 1, process_index: int = 0,
                 even_batches: bool = True):
        super().__init__(BatchSampler(sampler, 1, False), num_processes, process_index, even_batches=even_batches)

    def __iter__(self) -> Iterator[int]:
        for batch in super().__iter__():
            yield batch[0]


class _Indices:
    """Slices of an epoch's order as lists of Python ints; a tensor order is converted a chunk at a time (so the
    first batch does not wait for the whole epoch, and later ones do not pay a tensor slice each)."""

    CHUNK = 1 << 16

    def __init__(self, order):
        self.order = order
        self.chunk_start, self.chunk = -1, []

    def take(self, begin: int, end: int) -> list:
        if not isinstance(self.order, torch.Tensor):
            return _as_list(self.order[begin:end])
        start = begin - begin % self.CHUNK
        if end > start + self.CHUNK:  # straddles two chunks (rare)
            return self.order[begin:end].tolist()
        if start != self.chunk_start:
            self.chunk_start, self.chunk = start, self.order[start:start + self.CHUNK].tolist()
        return self.chunk[begin - start:end - start]


def _as_list(indices) -> list:
    """Python ints from a list, range or 1-d tensor of indices."""
    if isinstance(indices, list):
        return indices
    return indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)


def _cycled(source, length: int) -> list:
    """The first ``length`` items of ``source`` repeated end to end."""
    source = list(source)
    if length <= 0 or not source:
        return []
    repeats = -(-length // len(source))
    return (source * repeats)[:length]
