"""Inputs and outputs of pipeline-parallel inference (``accelerate.utils.operations`` names).

A pipeline splits a batch into one micro-batch per stage, so the batch is padded to a multiple of the number
of processes first (``pad_input_tensors``). The output exists only on the last stage; ``copy_tensor_to_devices``
gives it to every process without them knowing its shape in advance.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..core.aliases import NestedData

from .operations import TENSOR_TYPE_TO_INT, _state, broadcast, gather_object, recursively_apply

__all__ = ["gather_tensor_shape", "copy_tensor_to_devices", "pad_input_tensors"]


def _source(tensor) -> tuple[int, list, torch.dtype]:
    """``(process, shape, dtype)`` of the one process that passed a tensor (the others pass None)."""
    if tensor is not None and not isinstance(tensor, torch.Tensor):
        raise TypeError(f"Expected a tensor or None, got {type(tensor).__name__}.")
    mine = None if tensor is None else (list(tensor.shape), tensor.dtype)
    everyone = gather_object([mine])
    holders = [process for process, described in enumerate(everyone) if described is not None]
    if len(holders) != 1:
        which = "no process" if not holders else f"processes {holders}"
        raise ValueError(
            f"copy_tensor_to_devices / gather_tensor_shape need the tensor on exactly one process (None on the "
            f"others), but {which} passed one."
        )
    shape, dtype = everyone[holders[0]]
    return holders[0], shape, dtype


def gather_tensor_shape(tensor: Optional[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """``(shape, dtype_code)`` of a tensor that only one process has (the others pass None), on every process.

    ``shape`` is a 1-d int64 tensor on the process's device; ``dtype_code`` is the dtype's key in
    ``TENSOR_INT_TO_DTYPE``.
    """
    _, shape, dtype = _source(tensor)
    if dtype not in TENSOR_TYPE_TO_INT:
        raise TypeError(f"gather_tensor_shape cannot encode {dtype}; supported: {sorted(map(str, TENSOR_TYPE_TO_INT))}.")
    return torch.tensor(shape, dtype=torch.int64, device=_state().device), TENSOR_TYPE_TO_INT[dtype]


def copy_tensor_to_devices(tensor: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Give every process a copy of the tensor that exists on one process only (pass None on the others).

    Unlike ``broadcast`` the other processes need not know its shape or dtype. Returns a new tensor on each
    process's device; in a single process, the tensor itself.
    """
    state = _state()
    if not state.use_distributed:
        if tensor is None:
            raise ValueError("copy_tensor_to_devices got None in a single process: there is no tensor to copy.")
        return tensor
    source, shape, dtype = _source(tensor)
    if state.process_index == source:
        buffer = tensor.detach().to(state.device, copy=True).contiguous()
    else:
        buffer = torch.empty(shape, dtype=dtype, device=state.device)
    return broadcast(buffer, from_process=source)


def pad_input_tensors(tensor: NestedData, batch_size: int, num_processes: int, dim: int = 0) -> NestedData:
    """Pad every tensor of ``tensor`` (any nesting) with zeros along ``dim`` so that its ``batch_size`` entries
    split evenly over ``num_processes``: the size becomes the next multiple of ``num_processes`` (at least
    ``num_processes``), e.g. a batch of 3 for 4 processes becomes 4, a batch of 5 becomes 8.

    Tensors that already have that size are returned as they are. (The reference computes the target with a
    formula that gives sizes such as 11 for a batch of 9 on 4 processes, and pads batches that already split
    evenly; hasten gives the smallest size that splits.)
    """
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"pad_input_tensors: num_processes must be a positive int, got {num_processes!r}.")
    if not isinstance(batch_size, int) or batch_size < 0:
        raise ValueError(f"pad_input_tensors: batch_size must be a non-negative int, got {batch_size!r}.")
    target = max(math.ceil(batch_size / num_processes), 1) * num_processes

    def _pad(leaf: torch.Tensor) -> torch.Tensor:
        if leaf.ndim == 0:
            raise ValueError("pad_input_tensors got a 0-d tensor, which has no batch dimension to pad.")
        axis = dim % leaf.ndim
        size = leaf.shape[axis]
        if size == target:
            return leaf
        if size > target:
            raise ValueError(
                f"pad_input_tensors: a tensor has {size} entries along dim {dim}, more than the padded batch size "
                f"{target} (batch_size={batch_size}, num_processes={num_processes})."
            )
        new_shape = list(leaf.shape)
        new_shape[axis] = target
        padded = leaf.new_zeros(new_shape)
        padded.narrow(axis, 0, size).copy_(leaf)
        return padded

    _pad.__name__ = "pad_input_tensors"
    return recursively_apply(_pad, tensor, error_on_other_type=True)
