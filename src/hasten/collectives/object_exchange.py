"""Checked gather and broadcast of picklable objects, in no more collectives than torch's own.

``torch.distributed.all_gather_object`` and ``broadcast_object_list`` first exchange the pickle lengths, then
the bytes. Here the length exchange is the agreement header of ``collective_check`` (which also carries the
bytes themselves when they are small: then one collective in all), so the check rides along for free: a
process whose object cannot be pickled, a list of a different length (broadcast) or a list on one process
and another object on the next (gather) make every process raise ``DistributedOperationException`` instead of
leaving the others waiting in the collective.
"""
from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist

from .checks import DistributedOperationException, _all_gather_flat, eager_bytes, exchange_header_eager
from .process_view import Processes

__all__ = ["gather_objects_checked", "broadcast_objects_checked"]


def _pickled(obj) -> tuple[bytes, str]:
    """``(payload, "")``, or ``(b"", reason)`` when ``obj`` cannot be pickled."""
    try:
        return pickle.dumps(obj), ""
    except Exception as error:  # any pickling failure must reach the other processes, not only this one
        return b"", f"{type(error).__name__}: {error}"


def _to_bytes_tensor(payload: bytes, size: int, device) -> torch.Tensor:
    buffer = torch.zeros(size, dtype=torch.uint8)
    if payload:
        buffer[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    return buffer.to(device)


def _small(payload: bytes, state):
    """``payload`` as a tensor when it can ride in the header exchange, else None."""
    if len(payload) > eager_bytes(state.num_processes):
        return None
    return _to_bytes_tensor(payload, len(payload), state.device)


def _kind(obj) -> str:
    if isinstance(obj, (list, tuple)):
        return f"a {type(obj).__name__} of {len(obj)} items"
    return f"a {type(obj).__name__}"


def gather_objects_checked(obj: Any, state: Processes, operation: str = "gather_object") -> list:
    """Every process's ``obj``, in rank order. Every process must pass a list (or tuple), or every process
    something else; every object must pickle."""
    payload, error = _pickled(obj)
    is_sequence = isinstance(obj, (list, tuple))
    # a pickling error is made unique to its rank, so that it always takes the path that names every rank
    text = f"objects, sequence={is_sequence}" + (f", error on process {state.process_index}" if error else "")
    description = _kind(obj) + (f" that cannot be pickled ({error})" if error else "")
    sizes, rows = exchange_header_eager(
        operation, text, [len(payload)], lambda: description, state,
        problem="the processes must each pass a list (or tuple), or each pass another object, and every object "
                "must pickle", payload=_small(payload, state))
    lengths = [row[0] for row in sizes]
    if rows is None:  # too large to ride in the header: a second exchange, padded to the longest
        largest = max(lengths)
        output = torch.empty(state.num_processes * largest, dtype=torch.uint8, device=state.device)
        _all_gather_flat(output, _to_bytes_tensor(payload, largest, state.device), state)
        rows = output.view(state.num_processes, largest)
    rows = rows.cpu()
    return [pickle.loads(rows[rank, :length].numpy().tobytes()) for rank, length in enumerate(lengths)]


def broadcast_objects_checked(object_list: list, from_process: int, state: Processes) -> list:
    """Replace the items of ``object_list`` with those of process ``from_process``, in place. Every process
    must pass a list of the same length and the same ``from_process``; the sender's items must pickle."""
    sending = state.process_index == from_process
    payload, error = _pickled(list(object_list)) if sending else (b"", "")
    valid = isinstance(from_process, int) and 0 <= from_process < state.num_processes
    text = f"list of {len(object_list)} objects from process {from_process}" + (", error" if error else "")
    description = f"list of {len(object_list)} objects" + (
        f" from process {from_process}" if valid else f", from_process={from_process!r}") + (
        f", which cannot be pickled ({error})" if error else "")
    sizes, rows = exchange_header_eager(
        "broadcast_object_list", text, [len(payload)], lambda: description, state,
        problem="the processes must pass lists of the same length and the same from_process, and the sender's "
                "objects must pickle", payload=_small(payload, state))
    if not valid:  # every process passed the same invalid source
        raise ValueError(f"broadcast_object_list: from_process={from_process!r} is not a process of this run; "
                         f"use an int in [0, {state.num_processes - 1}].")
    if error:  # only reachable with one process holding the same text, which cannot happen; kept for safety
        raise DistributedOperationException(f"broadcast_object_list: cannot pickle the objects ({error}).")
    length = sizes[from_process][0]
    if rows is not None:  # the sender's bytes came with the header
        buffer = rows[from_process, :length]
    else:
        buffer = _to_bytes_tensor(payload, length, state.device)
        dist.broadcast(buffer, src=from_process)
    if not sending:
        object_list[:] = pickle.loads(buffer.cpu().numpy().tobytes())
    return object_list
