"""How the main process turns the batches it read into what each process receives (``DataLoaderDispatcher``).

Pure functions, no communication. A *step* is the batches read for one iteration of all processes: one batch
to cut in slices (``split_batches``) or ``num_processes`` batches. The plan is one of:

- ``SLICE``: the step's batches joined into one global batch; process ``i`` takes a contiguous slice of it.
  This is the reference library's behaviour; at the end of the data the global batch is completed with the
  first samples of the epoch (``even_batches``) so that it divides evenly.
- ``WHOLE``: a list of whole batches, the ``i``-th for process ``i``. Used where joining is impossible (tensors
  whose shapes differ beyond the batch dimension, differing non-sample fields) or where slicing would drop
  samples (batch sizes that do not add up to a multiple of the number of processes before the last step).

Samples are the rows of tensors whose first dimension is the batch size, and the items of lists / tuples of
that length that hold no tensor (strings, ids, ...). Anything else is a per-batch field and is sent as it is.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..collectives.operations import honor_type, is_namedtuple
from ..core.aliases import NestedData

__all__ = ["SLICE", "WHOLE", "StepPlan", "CannotJoin", "batch_size_of", "join_batches", "slice_batch",
           "process_bounds", "plan_step"]

SLICE, WHOLE = 0, 1


class CannotJoin(Exception):
    """The batches of a step cannot be joined into one global batch."""


@dataclass
class StepPlan:
    mode: int
    payload: Any  # SLICE: the global batch; WHOLE: list of per-process batches
    real: int  # real samples in this global step (-1 when unknown)
    total: int  # SLICE: samples of the global batch after completion; WHOLE: number of batches


def _contains_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_contains_tensor(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_contains_tensor(item) for item in value)
    return False


def _is_container(value) -> bool:
    return isinstance(value, (list, tuple, Mapping, torch.Tensor))


def _first_tensor(batch) -> Optional[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return batch if batch.ndim >= 1 else None
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


def _first_scalar_list(batch) -> Optional[int]:
    if isinstance(batch, (list, tuple)) and not is_namedtuple(batch) and not any(map(_is_container, batch)):
        return len(batch)
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        found = _first_scalar_list(item)
        if found is not None:
            return found
    return None


def batch_size_of(batch: NestedData) -> Optional[int]:
    """Samples in ``batch``: the first dimension of its first tensor, else the length of its first list of
    plain values; None when it has neither."""
    tensor = _first_tensor(batch)
    return tensor.shape[0] if tensor is not None else _first_scalar_list(batch)


def _is_sample_list(value, size: int) -> bool:
    return (isinstance(value, (list, tuple)) and not is_namedtuple(value) and len(value) == size
            and not _contains_tensor(value))


def _is_sample_tensor(value, size: int) -> bool:
    return isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == size


def _rebuild_mapping(original: Mapping, items: dict):
    try:
        return type(original)(items)
    except TypeError:
        rebuilt = copy.copy(original)
        for key, value in items.items():
            rebuilt[key] = value
        return rebuilt


def _same(values: list) -> bool:
    first = values[0]
    try:
        if isinstance(first, torch.Tensor):
            return all(isinstance(v, torch.Tensor) and v.shape == first.shape and torch.equal(v, first) for v in values)
        return all(bool(v == first) for v in values[1:])
    except Exception:  # values whose == is not a plain bool (arrays ...)
        return False


def _join(parts: list, sizes: list):
    first = parts[0]
    if all(_is_sample_tensor(part, size) for part, size in zip(parts, sizes)):
        try:
            return torch.cat(parts)
        except RuntimeError as error:
            raise CannotJoin(f"tensors of shapes {[tuple(p.shape) for p in parts]} cannot be joined ({error})") from None
    if all(_is_sample_list(part, size) for part, size in zip(parts, sizes)):
        return type(first)(item for part in parts for item in part)
    if isinstance(first, Mapping):
        if any(not isinstance(part, Mapping) or part.keys() != first.keys() for part in parts):
            raise CannotJoin("the batches do not have the same keys")
        return _rebuild_mapping(first, {key: _join([part[key] for part in parts], sizes) for key in first})
    if isinstance(first, (list, tuple)) and not isinstance(first, str):
        if any(type(part) is not type(first) or len(part) != len(first) for part in parts):
            raise CannotJoin("the batches do not have the same structure")
        return honor_type(first, (_join([part[i] for part in parts], sizes) for i in range(len(first))))
    if _same(parts):
        return first
    raise CannotJoin(f"a per-batch field differs between the batches ({type(first).__name__})")


def join_batches(batches: list) -> NestedData:
    """One batch holding the samples of ``batches`` in order (``CannotJoin`` when impossible)."""
    sizes = [batch_size_of(batch) for batch in batches]
    if any(size is None for size in sizes):
        raise CannotJoin("the batch has no tensor and no list of samples, so its samples cannot be told apart")
    return batches[0] if len(batches) == 1 else _join(batches, sizes)


def slice_batch(batch: NestedData, part: slice, size: Optional[int] = None) -> NestedData:
    """The samples ``part`` of ``batch`` (per-batch fields unchanged)."""
    size = batch_size_of(batch) if size is None else size
    if _is_sample_tensor(batch, size) or _is_sample_list(batch, size):
        return batch[part] if not isinstance(batch, tuple) else type(batch)(batch[part])
    if isinstance(batch, Mapping):
        return _rebuild_mapping(batch, {key: slice_batch(value, part, size) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)) and not isinstance(batch, str):
        return honor_type(batch, (slice_batch(item, part, size) for item in batch))
    return batch


def process_bounds(total: int, num_processes: int, process_index: int) -> slice:
    """Process ``process_index``'s contiguous part of ``total`` samples: equal parts when ``total`` divides,
    else the first processes take one more (nothing is dropped)."""
    per_process, extra = divmod(total, num_processes)
    start = process_index * per_process + min(process_index, extra)
    return slice(start, start + per_process + (1 if process_index < extra else 0))


def _default_slicer(batch, part, process_index=None, num_processes=None):
    return slice_batch(batch, part)


def _complete(batch, real: int, num_processes: int, material, slicer: Callable):
    """``batch`` followed by samples of ``material`` (cycled) up to a multiple of ``num_processes``."""
    missing = -real % num_processes
    available = batch_size_of(material) if material is not None else None
    if not available:
        raise CannotJoin("no samples to complete the batch with")
    pieces = [batch]
    while missing:
        take = min(missing, available)
        pieces.append(slicer(material, slice(0, take), process_index=0, num_processes=num_processes))
        missing -= take
    return join_batches(pieces)


def plan_step(batches: list, *, split_batches: bool, num_processes: int, is_last: bool, complete: bool,
              first_samples: Optional[NestedData], slice_fn: Optional[Callable[..., Any]] = None) -> StepPlan:
    """What each process receives for one step (see the module docstring).

    ``complete``: repeat samples so the last step gives every process the same amount (even_batches and not
    drop_last). ``first_samples``: the epoch's first ``num_processes`` samples, used to complete it.
    """
    slicer = slice_fn or _default_slicer
    try:
        joined = join_batches(batches)
    except CannotJoin as error:
        if split_batches:
            raise ValueError(
                f"dispatch_batches=True with split_batches=True cuts every batch into {num_processes} slices, but "
                f"this batch cannot be sliced: {error}. Make the collate_fn return tensors (or lists of per-sample "
                "values) whose first dimension is the batch size, or use dispatch_batches=False."
            ) from None
        joined = None
    if joined is not None:
        real = batch_size_of(joined)
        if real % num_processes == 0 or is_last or split_batches:
            if is_last and complete and real % num_processes:
                for material in (first_samples, joined):  # the epoch's start as the reference does, else itself
                    try:
                        padded = _complete(joined, real, num_processes, material, slicer)
                        return StepPlan(SLICE, padded, real, batch_size_of(padded))
                    except CannotJoin:
                        continue
            return StepPlan(SLICE, joined, real, real)
    # Whole batches: one per process; at the end, processes without one get a copy of a batch of this step.
    sizes = [batch_size_of(batch) for batch in batches]
    real = -1 if any(size is None for size in sizes) else sum(sizes)
    payload = list(batches)
    if is_last and complete:
        payload += [batches[i % len(batches)] for i in range(num_processes - len(batches))]
    return StepPlan(WHOLE, payload, real, len(payload))
