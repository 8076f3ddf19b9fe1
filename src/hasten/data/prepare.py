"""``prepare_data_loader``: turn the user's ``DataLoader`` into the loader of this process's share.

Every argument is checked before anything is built, so bad input fails at prepare time with an error that
names the value and the fix. The user's loader, sampler and batch sampler are left untouched where they are
torch's own classes (new ones are built); a custom batch sampler is wrapped, not copied.
"""
from __future__ import annotations

import copy
import sys
import warnings
from typing import Callable, Optional

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from ..config.enums import RNGType
from ..state import PartialState
from .batch_shard import BatchSamplerShard, SampleShard, positioned
from .device_mesh import data_parallel_layout
from .dispatcher import DataLoaderDispatcher
from .iterable import IterableDatasetShard
from .loader_core import loader_options
from .samplers import SeedableRandomSampler, get_sampler
from .shard_loader import DataLoaderShard
from .stateful import stateful_dataloader_class
from .validation import check_process_layout, check_rng_types, check_split_batch_size

__all__ = ["prepare_data_loader"]

def _batch_size_of(dataloader: DataLoader) -> Optional[int]:
    if dataloader.batch_size is not None:
        return dataloader.batch_size
    holder = dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else dataloader.batch_sampler
    return getattr(holder, "batch_size", None)


def _shuffle_without_global_rng(sampler, use_seedable_sampler: bool, data_seed: Optional[int]):
    """The sampler to use: seedable if asked, and never one that draws from torch's global generator per pass."""
    if not isinstance(sampler, RandomSampler) or isinstance(sampler, SeedableRandomSampler):
        return sampler
    if use_seedable_sampler:
        return SeedableRandomSampler(sampler.data_source, replacement=sampler.replacement,
                                     num_samples=sampler._num_samples, generator=sampler.generator, data_seed=data_seed)
    if sampler.generator is None:
        # A RandomSampler without generator draws a seed from the global generator at every pass; give it its
        # own generator instead, seeded once here (one draw, as the reference does for several processes).
        sampler = copy.copy(sampler)
        sampler.generator = torch.Generator()
        sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return sampler


def _with_sampler(batch_sampler, sampler):
    """``batch_sampler`` drawing from ``sampler``: a new torch ``BatchSampler``, or the custom one updated."""
    if sampler is getattr(batch_sampler, "sampler", None):
        return batch_sampler
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
    batch_sampler.sampler = sampler  # a custom batch sampler: it can only be updated in place
    return batch_sampler


def _hf_datasets_shard(dataset, num_processes: int, process_index: int, split_batches: bool):
    """A Hugging Face ``datasets.IterableDataset`` with enough shards is split by shards, as the reference does."""
    datasets = sys.modules.get("datasets")  # only if the user's code already uses it
    iterable = getattr(datasets, "IterableDataset", None)
    if (iterable is not None and isinstance(dataset, iterable) and not split_batches
            and getattr(dataset, "n_shards", 0) >= num_processes):
        return dataset.shard(num_shards=num_processes, index=process_index)
    return None


def prepare_data_loader(
    dataloader: DataLoader,
    device: Optional[torch.device] = None,
    num_processes: Optional[int] = None,
    process_index: Optional[int] = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: Optional[list] = None,
    dispatch_batches: Optional[bool] = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Optional[Callable] = None,
    use_seedable_sampler: bool = False,
    data_seed: Optional[int] = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh=None,
) -> DataLoader:
    """Wrap ``dataloader`` so that this process sees only its share of the data.

    Parameters:
        dataloader: the ``DataLoader`` to share out. Its batch size, collate_fn, workers, pin_memory, generator,
            worker_init_fn, persistent_workers, prefetch_factor and timeout are kept.
        device: where batches go when ``put_on_device`` (default: ``PartialState().device``).
        num_processes, process_index: default to ``PartialState``'s (or to the data-parallel layout of
            ``torch_device_mesh``).
        split_batches: cut each batch in ``num_processes`` slices (batch size must be a multiple) instead of
            giving each process whole batches.
        put_on_device: move batches (nested list / tuple / dict of tensors) to ``device``.
        rng_types: generators synchronised from process 0 at the start of every pass: ``"torch"``, ``"cuda"``,
            ``"xla"``, ``"generator"`` (the sampler's or iterable dataset's ``torch.Generator``).
        dispatch_batches: read on process 0 only and send each process its share (default: yes for an
            ``IterableDataset`` when real processes are running, else no).
        even_batches: repeat samples from the start so every process gets the same number of full batches.
        slice_fn_for_dispatch: ``fn(batch, slice, process_index=, num_processes=)`` cutting dispatched batches.
        use_seedable_sampler, data_seed: shuffle with ``SeedableRandomSampler(data_seed)``: bitwise reproducible,
            changed by ``set_epoch``.
        non_blocking: asynchronous host-to-device copies.
        use_stateful_dataloader: build on torchdata's ``StatefulDataLoader`` (extra ``hasten[stateful]``).
        torch_device_mesh: share the data over the mesh's data-parallel dimensions only.

    Returns a ``DataLoaderShard`` or ``DataLoaderDispatcher`` (both ``DataLoader`` subclasses).
    """
    # ---------------------------------------------------------------- checks, before any work
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"prepare_data_loader takes a torch.utils.data.DataLoader, got {type(dataloader).__name__}.")
    state = PartialState()
    if torch_device_mesh is not None:
        num_processes, process_index = data_parallel_layout(torch_device_mesh)
    num_processes = state.num_processes if num_processes is None else num_processes
    process_index = state.process_index if process_index is None else process_index
    check_process_layout(num_processes, process_index, "prepare_data_loader")
    dataset = dataloader.dataset
    is_iterable = isinstance(dataset, IterableDataset)
    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    if sampler_is_batch_sampler and dataloader.batch_size is not None:
        raise ValueError(
            f"The DataLoader's sampler is a batch sampler ({type(dataloader.sampler).__name__}) but batch_size="
            f"{dataloader.batch_size}: each of its batches would be wrapped in another batch. Pass "
            "batch_sampler=... instead of sampler=..., or batch_size=None."
        )
    if split_batches and num_processes > 1:
        check_split_batch_size(_batch_size_of(dataloader), num_processes, "prepare_data_loader(split_batches=True)")
    parsed_rng_types = check_rng_types(rng_types)
    if slice_fn_for_dispatch is not None and not callable(slice_fn_for_dispatch):
        raise TypeError(f"slice_fn_for_dispatch must be a callable, got {slice_fn_for_dispatch!r}.")
    if use_stateful_dataloader:
        stateful_dataloader_class()  # ImportError naming the extra when torchdata is missing
    if data_seed is not None and not use_seedable_sampler:
        warnings.warn("data_seed has no effect without use_seedable_sampler=True.", stacklevel=2)
    unbatched = dataloader.batch_size is None and dataloader.batch_sampler is None and not sampler_is_batch_sampler
    if dispatch_batches is None:
        dispatch_batches = is_iterable and not unbatched and state.num_processes % num_processes == 0
    if dispatch_batches and unbatched:
        raise ValueError(
            "dispatch_batches=True shares out batches, but this DataLoader has batch_size=None (it yields single "
            "samples). Give it a batch_size, or use dispatch_batches=False."
        )
    if dispatch_batches and state.num_processes % num_processes:
        raise ValueError(
            f"dispatch_batches=True sends batches between processes, but num_processes={num_processes} does not "
            f"divide the {state.num_processes} running process(es). Launch that many processes, or use "
            "dispatch_batches=False to simulate them in one process."
        )

    # ---------------------------------------------------------------- build
    options = loader_options(dataloader, use_stateful_dataloader)
    synchronized_generator = None
    batching: dict
    if is_iterable:
        batching = {"batch_size": dataloader.batch_size, "drop_last": dataloader.drop_last}
        if not dispatch_batches and num_processes > 1:
            by_shards = _hf_datasets_shard(dataset, num_processes, process_index, split_batches)
            if by_shards is not None:
                dataset = by_shards
            else:
                generator = getattr(dataset, "generator", None)
                synchronized_generator = generator if isinstance(generator, torch.Generator) else None
                dataset = IterableDatasetShard(dataset, batch_size=dataloader.batch_size or 1,
                                               drop_last=dataloader.drop_last, num_processes=num_processes,
                                               process_index=process_index, split_batches=split_batches)
                if split_batches:
                    batching["batch_size"] = dataloader.batch_size // num_processes
    else:
        sampler = _shuffle_without_global_rng(get_sampler(dataloader), use_seedable_sampler, data_seed)
        # "generator" means the sampler's generator, or the batch sampler's when there is no sampler
        holder = sampler if sampler is not None else (dataloader.batch_sampler or dataloader.sampler)
        if not isinstance(holder, SeedableRandomSampler) and isinstance(getattr(holder, "generator", None),
                                                                         torch.Generator):
            synchronized_generator = holder.generator
        even = even_batches and num_processes > 1
        if unbatched:
            batching = {"sampler": SampleShard(sampler, num_processes, process_index, even_batches=even),
                        "batch_size": None}
        else:
            original = dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler
            if sampler is not None:
                original = _with_sampler(original, sampler)
            if dispatch_batches:  # process 0 reads the original batches; the wrapper only adds positions
                shard = positioned(original)
            else:
                shard = BatchSamplerShard(original, num_processes, process_index, split_batches=split_batches,
                                          even_batches=even)
            batching = ({"sampler": shard, "batch_size": None} if sampler_is_batch_sampler
                        else {"batch_sampler": shard})
    kept_rng_types = [kind for kind in parsed_rng_types
                      if kind != RNGType.GENERATOR or synchronized_generator is not None]

    if dispatch_batches:
        target = (device if device is not None else state.device) if put_on_device else torch.device("cpu")
        return DataLoaderDispatcher(
            dataset, split_batches=split_batches, use_stateful_dataloader=use_stateful_dataloader,
            _drop_last=dataloader.drop_last, _non_blocking=non_blocking, slice_fn=slice_fn_for_dispatch,
            torch_device_mesh=torch_device_mesh, even_batches=even_batches, num_processes=num_processes,
            process_index=process_index, device=target, **batching, **options,
        )
    return DataLoaderShard(
        dataset, device=(device if device is not None else state.device) if put_on_device else None,
        rng_types=kept_rng_types or None, synchronized_generator=synchronized_generator,
        use_stateful_dataloader=use_stateful_dataloader, _drop_last=dataloader.drop_last,
        _non_blocking=non_blocking, torch_device_mesh=torch_device_mesh, **batching, **options,
    )
