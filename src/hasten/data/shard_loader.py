"""``DataLoaderShard``: the loader each process iterates for its own share of the data (no dispatching)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from torch.utils.data import BatchSampler, Dataset

from ..collectives.operations import send_to_device
from ..collectives.random import synchronize_rng_states
from ..core.aliases import Device
from .batch_shard import BatchSamplerShard
from .iterable import IterableDatasetShard
from .loader_core import PreparedDataLoader
from .placement import as_device, on_device

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..config.enums import RNGType

__all__ = ["DataLoaderShard"]


class DataLoaderShard(PreparedDataLoader):
    """A ``DataLoader`` that yields this process's batches, on ``device``, and keeps ``GradientState`` informed.

    Parameters:
        dataset: the dataset (usually already sharded: ``IterableDatasetShard``, or a ``BatchSamplerShard`` given
            as ``batch_sampler``).
        device: move every batch there (nested list / tuple / dict of tensors); ``None`` leaves them.
        rng_types: generators synchronised from process 0 at the start of every pass (``"torch"``, ``"cuda"``,
            ``"xla"``, ``"generator"`` = ``synchronized_generator``).
        synchronized_generator: the ``torch.Generator`` meant by ``"generator"``.
        skip_batches: batches to skip at the start of the first pass only (to resume mid-epoch).
        use_stateful_dataloader: build on torchdata's ``StatefulDataLoader`` instead of ``DataLoader``.
        **kwargs: the usual ``DataLoader`` arguments.

    It reads one batch ahead, so that ``end_of_dataloader`` is already true while the last batch is in use.
    """

    def __init__(self, dataset: Dataset, device: Optional[Device] = None,
                 rng_types: Optional[list[Union[str, RNGType]]] = None,
                 synchronized_generator: Optional[torch.Generator] = None, skip_batches: int = 0,
                 use_stateful_dataloader: bool = False, _drop_last: bool = False, _non_blocking: bool = False,
                 torch_device_mesh: Optional[DeviceMesh] = None, iteration: int = 0, **kwargs: Any):
        super().__init__(dataset, skip_batches=skip_batches, use_stateful_dataloader=use_stateful_dataloader,
                         iteration=iteration, **kwargs)
        self.device = device
        self.rng_types = list(rng_types) if rng_types is not None else None
        self.synchronized_generator = synchronized_generator
        self.torch_device_mesh = torch_device_mesh
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking

    # ------------------------------------------------------------------ sizes
    def _sharding_batch_sampler(self) -> Optional[BatchSamplerShard]:
        for candidate in (self.batch_sampler, self.sampler):
            if isinstance(candidate, BatchSamplerShard):
                return candidate
        return None

    @property
    def total_batch_size(self) -> int:
        """Samples all processes take together in one step."""
        shard = self._sharding_batch_sampler()
        if shard is not None:
            return shard.batch_size if shard.split_batches else shard.batch_size * shard.num_processes
        if isinstance(self.dataset, IterableDatasetShard):
            return self.dataset.global_batch_size
        sampler = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        return getattr(sampler, "batch_size", None) or self.batch_size

    def _expected_remainder(self) -> int:
        shard = self._sharding_batch_sampler()
        if shard is not None:
            return shard.last_global_batch_real_samples()
        if isinstance(self.dataset, IterableDatasetShard):
            return self.dataset.last_global_batch_real_samples()
        try:
            count, total = len(self.dataset), self.total_batch_size
        except TypeError:
            return -1
        if not total:
            return -1
        if self._drop_last:
            return total if count >= total else 0
        return count % total or (total if count else 0)

    # ------------------------------------------------------------------ iteration
    def __iter__(self):
        if self.rng_types:
            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        self._begin_pass()
        completed = False
        try:
            batches = super().__iter__()
            for _ in range(self._replay):
                next(batches, None)
            snapshot = self._lookahead_snapshotter()
            device, non_blocking = self.device, self._non_blocking
            placed_on = None if device is None else as_device(device)  # to compare with the batch's devices
            # Per-batch bookkeeping is written to the instance dict directly: DataLoader.__setattr__ (a Python
            # method guarding its batching options) would otherwise run on every batch.
            fields = self.__dict__
            try:
                current = next(batches)
            except StopIteration:
                completed = True
                return
            while True:
                if device is not None and not on_device(current, placed_on):  # already there: nothing to move
                    current = send_to_device(current, device, non_blocking=non_blocking)
                if snapshot is not None:
                    fields["_lookahead_state"] = snapshot()
                try:
                    following = next(batches)
                except StopIteration:
                    self.end_of_dataloader = True
                    fields["_position"] += 1
                    yield current
                    break
                fields["_position"] += 1
                yield current
                current = following
            completed = True
        finally:
            self._end_pass(completed)
