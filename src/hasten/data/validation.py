"""Checks of data-loading arguments, each raising an error that names the bad value and the fix."""
from __future__ import annotations

import importlib.util
from typing import Iterable, Optional, Union

import torch

from ..config.enums import RNGType

__all__ = ["check_process_layout", "check_split_batch_size", "check_non_negative_int", "check_rng_types"]


def check_non_negative_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
    return value


def check_process_layout(num_processes: int, process_index: int, where: str) -> None:
    """``num_processes >= 1`` and ``0 <= process_index < num_processes``."""
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"{where}: num_processes must be an int >= 1, got {num_processes!r}.")
    if isinstance(process_index, bool) or not isinstance(process_index, int) or not 0 <= process_index < num_processes:
        raise ValueError(
            f"{where}: process_index must be an int in [0, {num_processes - 1}] for num_processes={num_processes}, "
            f"got {process_index!r}."
        )


def check_split_batch_size(batch_size: Optional[int], num_processes: int, where: str) -> None:
    """With ``split_batches`` every batch is cut in ``num_processes`` equal slices: the size must allow it."""
    if batch_size is None:
        raise ValueError(
            f"{where} needs to know the batch size, but the data loader has batch_size=None and its batch sampler "
            "has no `batch_size` attribute. Give the batch sampler a `batch_size` attribute, or use "
            "split_batches=False."
        )
    if batch_size % num_processes != 0 or batch_size < num_processes:
        raise ValueError(
            f"{where}: the batch size ({batch_size}) must be a round multiple of the number of processes "
            f"({num_processes}) so that each batch can be cut in equal slices. Use a batch size of "
            f"{_next_multiple(batch_size, num_processes)} (or another multiple of {num_processes}), "
            "or split_batches=False to give each process whole batches."
        )


def _next_multiple(value: int, step: int) -> int:
    return max(step, -(-value // step) * step)


def _device_rng_available(name: str) -> bool:
    if name == "xla":
        return importlib.util.find_spec("torch_xla") is not None
    module = getattr(torch, name, None)
    is_available = getattr(module, "is_available", None)
    return bool(is_available and is_available())


def check_rng_types(rng_types: Optional[Union[str, RNGType, Iterable[Union[str, RNGType]]]]) -> list[RNGType]:
    """``rng_types`` as a new list of ``RNGType``; unknown names and devices absent here are errors."""
    if rng_types is None:
        return []
    if isinstance(rng_types, (str, RNGType)):
        rng_types = [rng_types]
    parsed = []
    for value in rng_types:
        kind = RNGType.parse(value, "rng type in rng_types")
        if kind not in (RNGType.TORCH, RNGType.GENERATOR) and not _device_rng_available(kind.value):
            raise ValueError(
                f"rng_types contains {value!r}, but no {kind.value.upper()} device is available in this process, so "
                f"its generator cannot be synchronised. Remove {value!r} from rng_types (keep 'torch' / 'generator')."
            )
        parsed.append(kind)
    return parsed
