"""Every argument of ``prepare_data_loader`` checked, and its defaults resolved, before anything is built.

The result is a ``LoaderRequest``: what ``prepare.py`` builds from, with no question left open (how many
processes, which one this is, whether batches are dispatched). An error here leaves the user's loader as it was.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from ..state import PartialState
from .device_mesh import data_parallel_layout
from .stateful import stateful_dataloader_class
from .validation import check_process_layout, check_rng_types, check_split_batch_size

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..config.enums import RNGType

__all__ = ["LoaderRequest", "checked_request"]


@dataclass(frozen=True)
class LoaderRequest:
    """One ``prepare_data_loader`` call, checked: its arguments with every default resolved."""

    dataloader: DataLoader
    num_processes: int
    process_index: int
    batch_device: Optional[torch.device]  # where batches are moved (None: they stay where they are)
    split_batches: bool
    rng_types: list  # RNGType values
    dispatch_batches: bool
    even_batches: bool
    slice_fn_for_dispatch: Optional[Callable]
    use_seedable_sampler: bool
    data_seed: Optional[int]
    non_blocking: bool
    use_stateful_dataloader: bool
    torch_device_mesh: object
    sampler_is_batch_sampler: bool  # a batch sampler given as ``sampler=`` (with batch_size=None)
    unbatched: bool  # the loader yields single samples (batch_size=None, no batch sampler)

    @property
    def is_iterable(self) -> bool:
        return isinstance(self.dataloader.dataset, IterableDataset)


def checked_request(dataloader: DataLoader, *, device: Optional[torch.device], num_processes: Optional[int],
                    process_index: Optional[int], split_batches: bool, put_on_device: bool,
                    rng_types: Optional[list[Union[str, RNGType]]], dispatch_batches: Optional[bool],
                    even_batches: bool, slice_fn_for_dispatch: Optional[Callable[..., Any]],
                    use_seedable_sampler: bool, data_seed: Optional[int], non_blocking: bool,
                    use_stateful_dataloader: bool, torch_device_mesh: Optional[DeviceMesh]) -> LoaderRequest:
    """Check the arguments of ``prepare_data_loader`` (same names, same meaning) in the order the errors are
    documented, and resolve their defaults."""
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"prepare_data_loader takes a torch.utils.data.DataLoader, got {type(dataloader).__name__}.")
    state = PartialState()
    num_processes, process_index = _process_layout(state, num_processes, process_index, torch_device_mesh)
    sampler_is_batch_sampler = _check_batching(dataloader, split_batches, num_processes)
    parsed_rng_types = check_rng_types(rng_types)
    _check_options(slice_fn_for_dispatch, use_stateful_dataloader, data_seed, use_seedable_sampler)
    unbatched = dataloader.batch_size is None and dataloader.batch_sampler is None and not sampler_is_batch_sampler
    dispatch_batches = _dispatch_decision(dispatch_batches, isinstance(dataloader.dataset, IterableDataset),
                                          unbatched, num_processes, state.num_processes)
    return LoaderRequest(
        dataloader=dataloader, num_processes=num_processes, process_index=process_index,
        batch_device=(device if device is not None else state.device) if put_on_device else None,
        split_batches=split_batches, rng_types=parsed_rng_types, dispatch_batches=dispatch_batches,
        even_batches=even_batches, slice_fn_for_dispatch=slice_fn_for_dispatch,
        use_seedable_sampler=use_seedable_sampler, data_seed=data_seed, non_blocking=non_blocking,
        use_stateful_dataloader=use_stateful_dataloader, torch_device_mesh=torch_device_mesh,
        sampler_is_batch_sampler=sampler_is_batch_sampler, unbatched=unbatched,
    )


def _process_layout(state: PartialState, num_processes, process_index, torch_device_mesh) -> tuple[int, int]:
    """``(num_processes, process_index)`` the data is shared over: the mesh's data-parallel layout, else the
    given values, else the running processes'."""
    if torch_device_mesh is not None:
        num_processes, process_index = data_parallel_layout(torch_device_mesh)
    num_processes = state.num_processes if num_processes is None else num_processes
    process_index = state.process_index if process_index is None else process_index
    check_process_layout(num_processes, process_index, "prepare_data_loader")
    return num_processes, process_index


def _batch_size_of(dataloader: DataLoader) -> Optional[int]:
    """The loader's batch size, or its batch sampler's when the loader itself has none."""
    if dataloader.batch_size is not None:
        return dataloader.batch_size
    holder = dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else dataloader.batch_sampler
    return getattr(holder, "batch_size", None)


def _check_batching(dataloader: DataLoader, split_batches: bool, num_processes: int) -> bool:
    """Check how the loader forms batches; return whether its ``sampler`` is a batch sampler."""
    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    if sampler_is_batch_sampler and dataloader.batch_size is not None:
        raise ValueError(
            f"The DataLoader's sampler is a batch sampler ({type(dataloader.sampler).__name__}) but batch_size="
            f"{dataloader.batch_size}: each of its batches would be wrapped in another batch. Pass "
            "batch_sampler=... instead of sampler=..., or batch_size=None."
        )
    if split_batches and num_processes > 1:
        check_split_batch_size(_batch_size_of(dataloader), num_processes, "prepare_data_loader(split_batches=True)")
    return sampler_is_batch_sampler


def _check_options(slice_fn_for_dispatch, use_stateful_dataloader: bool, data_seed, use_seedable_sampler: bool) -> None:
    if slice_fn_for_dispatch is not None and not callable(slice_fn_for_dispatch):
        raise TypeError(f"slice_fn_for_dispatch must be a callable, got {slice_fn_for_dispatch!r}.")
    if use_stateful_dataloader:
        stateful_dataloader_class()  # ImportError naming the extra when torchdata is missing
    if data_seed is not None and not use_seedable_sampler:
        # stacklevel 4: the warning points at the caller of prepare_data_loader (through checked_request)
        warnings.warn("data_seed has no effect without use_seedable_sampler=True.", stacklevel=4)


def _dispatch_decision(dispatch_batches: Optional[bool], is_iterable: bool, unbatched: bool, num_processes: int,
                       running_processes: int) -> bool:
    """Whether process 0 reads the data and sends each process its share (default: for an iterable dataset
    whose simulated processes fit the running ones); an impossible request is an error."""
    if dispatch_batches is None:
        dispatch_batches = is_iterable and not unbatched and running_processes % num_processes == 0
    if dispatch_batches and unbatched:
        raise ValueError(
            "dispatch_batches=True shares out batches, but this DataLoader has batch_size=None (it yields single "
            "samples). Give it a batch_size, or use dispatch_batches=False."
        )
    if dispatch_batches and running_processes % num_processes:
        raise ValueError(
            f"dispatch_batches=True sends batches between processes, but num_processes={num_processes} does not "
            f"divide the {running_processes} running process(es). Launch that many processes, or use "
            "dispatch_batches=False to simulate them in one process."
        )
    return dispatch_batches
