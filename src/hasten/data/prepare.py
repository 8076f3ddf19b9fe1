"""``prepare_data_loader``: turn the user's ``DataLoader`` into the loader of this process's share.

Every argument is checked before anything is built (``prepare_checks.py``), so bad input fails at prepare
time with an error that names the value and the fix; this module builds the loader from the checked request. The user's loader, sampler and batch sampler are left untouched where they are
torch's own classes (new ones are built); a custom batch sampler is wrapped, not copied.
"""
from __future__ import annotations

import copy
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from ..config.enums import RNGType
from .batch_shard import BatchSamplerShard, SampleShard, positioned
from .dispatcher import DataLoaderDispatcher
from .iterable import IterableDatasetShard
from .loader_core import loader_options
from .prepare_checks import LoaderRequest, checked_request
from .samplers import SeedableRandomSampler, get_sampler
from .shard_loader import DataLoaderShard

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["prepare_data_loader"]


def prepare_data_loader(
    dataloader: DataLoader,
    device: Optional[torch.device] = None,
    num_processes: Optional[int] = None,
    process_index: Optional[int] = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: Optional[list[Union[str, RNGType]]] = None,
    dispatch_batches: Optional[bool] = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Optional[Callable[..., Any]] = None,
    use_seedable_sampler: bool = False,
    data_seed: Optional[int] = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Optional[DeviceMesh] = None,
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
    request = checked_request(
        dataloader, device=device, num_processes=num_processes, process_index=process_index,
        split_batches=split_batches, put_on_device=put_on_device, rng_types=rng_types,
        dispatch_batches=dispatch_batches, even_batches=even_batches, slice_fn_for_dispatch=slice_fn_for_dispatch,
        use_seedable_sampler=use_seedable_sampler, data_seed=data_seed, non_blocking=non_blocking,
        use_stateful_dataloader=use_stateful_dataloader, torch_device_mesh=torch_device_mesh,
    )
    prepared = _build(request)
    pending = getattr(dataloader, "_pending_skip", 0) if isinstance(dataloader, DataLoaderShard) else 0
    if pending:  # skip_first_batches(loader, n) given to prepare: the prepared loader skips them too
        from .resume import skip_first_batches

        prepared = skip_first_batches(prepared, pending)
    return prepared


def _build(request: LoaderRequest) -> DataLoader:
    """The loader of this process's share: a dispatcher, or a loader over its shard of the data."""
    options = loader_options(request.dataloader, request.use_stateful_dataloader)
    if request.is_iterable:
        dataset, batching, synchronized_generator = _iterable_batching(request)
    else:
        dataset = request.dataloader.dataset
        batching, synchronized_generator = _sampler_batching(request)
    if request.dispatch_batches:
        return _dispatcher(request, dataset, batching, options)
    return _shard_loader(request, dataset, batching, synchronized_generator, options)


def _iterable_batching(request: LoaderRequest):
    """``(dataset, batching, generator)`` for an iterable dataset: this process's shard of it (unless batches are
    dispatched), the batching arguments of the new loader, and the dataset's generator to synchronise (or None)."""
    dataloader = request.dataloader
    dataset = dataloader.dataset
    batching = {"batch_size": dataloader.batch_size, "drop_last": dataloader.drop_last}
    if request.dispatch_batches or request.num_processes == 1:
        return dataset, batching, None
    by_shards = _hf_datasets_shard(dataset, request.num_processes, request.process_index, request.split_batches)
    if by_shards is not None:
        return by_shards, batching, None
    generator = getattr(dataset, "generator", None)
    shard = IterableDatasetShard(dataset, batch_size=dataloader.batch_size or 1, drop_last=dataloader.drop_last,
                                 num_processes=request.num_processes, process_index=request.process_index,
                                 split_batches=request.split_batches)
    if request.split_batches:
        batching["batch_size"] = dataloader.batch_size // request.num_processes
    return shard, batching, generator if isinstance(generator, torch.Generator) else None


def _sampler_batching(request: LoaderRequest):
    """``(batching, generator)`` for a map-style dataset: the (batch) sampler of this process's share, and the
    sampler's generator to synchronise (or None)."""
    dataloader = request.dataloader
    sampler = _shuffle_without_global_rng(get_sampler(dataloader), request.use_seedable_sampler, request.data_seed)
    # "generator" means the sampler's generator, or the batch sampler's when there is no sampler
    holder = sampler if sampler is not None else (dataloader.batch_sampler or dataloader.sampler)
    generator = getattr(holder, "generator", None)
    if isinstance(holder, SeedableRandomSampler) or not isinstance(generator, torch.Generator):
        generator = None  # a seedable sampler reseeds itself every epoch
    even = request.even_batches and request.num_processes > 1
    if request.unbatched:
        shard = SampleShard(sampler, request.num_processes, request.process_index, even_batches=even)
        return {"sampler": shard, "batch_size": None}, generator
    original = dataloader.sampler if request.sampler_is_batch_sampler else dataloader.batch_sampler
    if sampler is not None:
        original = _with_sampler(original, sampler)
    if request.dispatch_batches:  # process 0 reads the original batches; the wrapper only adds positions
        shard = positioned(original)
    else:
        shard = BatchSamplerShard(original, request.num_processes, request.process_index,
                                  split_batches=request.split_batches, even_batches=even)
    batching = {"sampler": shard, "batch_size": None} if request.sampler_is_batch_sampler else {"batch_sampler": shard}
    return batching, generator


def _dispatcher(request: LoaderRequest, dataset, batching: dict, options: dict) -> DataLoaderDispatcher:
    """Process 0 reads the batches and sends each process its slice (kept on the CPU unless put_on_device)."""
    return DataLoaderDispatcher(
        dataset, split_batches=request.split_batches, use_stateful_dataloader=request.use_stateful_dataloader,
        _drop_last=request.dataloader.drop_last, _non_blocking=request.non_blocking,
        slice_fn=request.slice_fn_for_dispatch, torch_device_mesh=request.torch_device_mesh,
        even_batches=request.even_batches, num_processes=request.num_processes,
        process_index=request.process_index,
        device=request.batch_device if request.batch_device is not None else torch.device("cpu"),
        **batching, **options,
    )


def _shard_loader(request: LoaderRequest, dataset, batching: dict, synchronized_generator, options: dict) -> DataLoaderShard:
    """Each process reads its own shard; the generators in ``rng_types`` are synchronised every pass."""
    # "generator" is kept only when there is a generator to synchronise
    rng_types = [kind for kind in request.rng_types if kind != RNGType.GENERATOR or synchronized_generator is not None]
    return DataLoaderShard(
        dataset, device=request.batch_device, rng_types=rng_types or None,
        synchronized_generator=synchronized_generator, use_stateful_dataloader=request.use_stateful_dataloader,
        _drop_last=request.dataloader.drop_last, _non_blocking=request.non_blocking,
        torch_device_mesh=request.torch_device_mesh, **batching, **options,
    )


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
