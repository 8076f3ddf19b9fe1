"""Agreement checks for collectives: every process must pass matching inputs, or every process raises.

Raw ``torch.distributed`` collectives do not fail cleanly on mismatched inputs: on gloo an all-gather of
different sizes aborts the process, a broadcast of different sizes silently writes a partial copy. hasten's
collectives therefore first all-gather one small, fixed-size header (``HEADER_SLOTS`` int64 per process):

- slot 0: a hash of what must match (operation, nesting, dict keys, list lengths, dtypes, the shapes that must
  agree, non-tensor leaves);
- slot 1: the length of a small payload sent along (``gather``, ``reduce`` and ``broadcast`` of up to 16 KiB
  per process send their data right there, so they need no second collective), or -1;
- slots 2..: sizes that may differ (first dimensions for ``gather``, sizes along ``dim`` for
  ``pad_across_processes``, pickle lengths for the object collectives), so calls that need those sizes anyway
  pay nothing extra.

When the hashes differ, every process all-gathers a readable description of its inputs and raises the same
``DistributedOperationException`` naming every process's inputs; the process group stays usable.

The checks are on by default. ``HASTEN_DEBUG_MODE=0`` (or ``ACCELERATE_DEBUG_MODE=0``) turns them off for
the run, ``set_collective_checks(False)`` / ``with collective_checks(False):`` in code (see docs/debugging.md).
"""
from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping
from collections.abc import Iterator
from typing import Callable, Optional

import torch
import torch.distributed as dist

from ..core.nested import is_namedtuple, leaves
from ..core.aliases import NestedData
from .process_view import Processes, group_of

__all__ = ["DistributedOperationException", "EAGER_BYTES", "collective_checks", "collective_checks_enabled",
           "set_collective_checks"]

HEADER_SLOTS = 16  # int64 per process: the signature, a payload length, then up to 14 sizes (more: a hash)
EAGER_BYTES = 16384  # a payload this small rides in the header exchange (gather: no second collective) ...
_EAGER_TOTAL = 1 << 18  # ... as long as the whole exchange stays under 256 KiB (fewer bytes on large worlds)
_HEADER_BYTES = HEADER_SLOTS * 8
ALIGN = 16  # payload pieces start at multiples of this, so that they can be viewed as any dtype


def eager_bytes(world: int) -> int:
    """How many payload bytes per process ride in the header exchange on ``world`` processes."""
    return min(EAGER_BYTES, _EAGER_TOTAL // max(world, 1)) // ALIGN * ALIGN


class DistributedOperationException(Exception):
    """A collective cannot run because the processes passed inputs that do not match."""


# --------------------------------------------------------------------------------------------- the switch
_override: Optional[bool] = None


def set_collective_checks(enabled: Optional[bool]) -> None:
    """Turn the agreement checks of hasten's collectives on (``True``) or off (``False``) in this process, or
    go back to the environment's choice (``None``). Every process must make the same choice."""
    global _override
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"set_collective_checks takes True, False or None, got {enabled!r}.")
    _override = enabled


@contextlib.contextmanager
def collective_checks(enabled: bool) -> Iterator[None]:
    """``with collective_checks(False): ...`` runs the block with the checks off (on with ``True``)."""
    global _override
    previous = _override
    set_collective_checks(enabled)
    try:
        yield
    finally:
        _override = previous


def collective_checks_enabled(state: Optional[Processes] = None) -> bool:
    """Whether hasten's collectives check their inputs: ``set_collective_checks`` when it was called, else on
    unless ``HASTEN_DEBUG_MODE`` (or ``ACCELERATE_DEBUG_MODE``) is set to a false value such as ``0``.
    ``PartialState().debug = True`` turns them on too."""
    if _override is not None:
        return _override
    if state is None:
        from ..state import PartialState

        state = PartialState() if PartialState._shared_state else None
    if state is not None and getattr(state, "debug", False):
        return True
    from ..core.env_aliases import read_setting
    from ..core.env_vars import str_to_bool

    value, variable = read_setting("debug_mode", parse=lambda raw: bool(str_to_bool(raw)))
    return variable is None or value


# --------------------------------------------------------------------------------------------- signatures
def describe(data: NestedData, leaf: Callable[[torch.Tensor], str]) -> str:
    """A compact, deterministic text of ``data``'s structure with each tensor written by ``leaf``."""

    if isinstance(data, torch.Tensor):
        return leaf(data)
    if is_namedtuple(data):
        return f"{type(data).__name__}({', '.join(describe(item, leaf) for item in data)})"
    if isinstance(data, (tuple, list)):
        body = ", ".join(describe(item, leaf) for item in data)
        return f"({body})" if isinstance(data, tuple) else f"[{body}]"
    if isinstance(data, Mapping):
        prefix = "" if type(data) is dict else type(data).__name__
        return prefix + "{" + ", ".join(f"{key!r}: {describe(value, leaf)}" for key, value in data.items()) + "}"
    return f"<{type(data).__name__}>"


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).replace("torch.", "")


def _device_suffix(tensor: torch.Tensor) -> str:
    return "" if tensor.device.type == "cpu" else f" on {tensor.device.type}"


def full_leaf(tensor: torch.Tensor) -> str:
    """dtype, every dimension and (when not CPU) device type: ``float32[8, 10]``."""
    if getattr(tensor, "is_nested", False):
        return f"nested {_dtype(tensor)}{_device_suffix(tensor)}"
    return f"{_dtype(tensor)}{list(tensor.shape)}{_device_suffix(tensor)}"


def gather_leaf(tensor: torch.Tensor) -> str:
    """What must match for ``gather``: dtype, device type and every dimension but the first."""
    if getattr(tensor, "is_nested", False) or tensor.ndim == 0:
        return full_leaf(tensor)
    rest = "".join(f", {size}" for size in tensor.shape[1:])
    return f"{_dtype(tensor)}[*{rest}]{_device_suffix(tensor)}"


def ndim_leaf(tensor: torch.Tensor) -> str:
    """What must match for ``pad_across_processes``: the number of dimensions."""
    return "nested" if getattr(tensor, "is_nested", False) else f"{tensor.ndim}d"


def signature(text: str) -> int:
    """A 63-bit hash of ``text`` that is the same in every process (unlike ``hash``, which is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


# --------------------------------------------------------------------------------------------- the exchange
SAME_INPUTS = "the processes passed inputs whose structure, shapes or dtypes differ, and they must match"


def _all_gather_flat(output: torch.Tensor, tensor: torch.Tensor, state: Processes) -> None:
    """All-gather the 1-d ``tensor`` of every rank into ``output``, rank after rank."""
    group = group_of(state)
    if hasattr(dist, "all_gather_single"):
        dist.all_gather_single(output, tensor, group=group)
    elif state.backend == "gloo":  # older gloo builds lack the single-tensor form
        dist.all_gather(list(output.chunk(state.num_processes)), tensor, group=group)
    else:
        dist.all_gather_into_tensor(output, tensor, group=group)


def raise_mismatch(operation: str, description: str, state: Processes, hint: str = "",
                   problem: str = SAME_INPUTS) -> None:
    """Every rank calls this after seeing different signatures: share the descriptions and raise everywhere."""
    everyone = [None] * state.num_processes
    dist.all_gather_object(everyone, (operation, description), group=group_of(state))
    operations = {op for op, _ in everyone}
    lines = "\n".join(
        f"  - process {rank}: {text}" + (f" (in `{op}`)" if len(operations) > 1 else "")
        for rank, (op, text) in enumerate(everyone))
    if len(operations) > 1:
        problem = "the processes called different collectives at the same point"
    raise DistributedOperationException(f"Cannot run `{operation}`: {problem}.\n{lines}{hint}")


def exchange_header(operation: str, text: str, sizes: list[int], describe_inputs: Callable[[], str], state: Processes,
                    hint: str = "", problem: str = SAME_INPUTS) -> list[list[int]]:
    """All-gather ``signature(operation + text)`` with ``sizes``; return every process's sizes (a list per
    process), or raise ``DistributedOperationException`` on every process when the signatures differ."""
    return exchange_header_eager(operation, text, sizes, describe_inputs, state, hint, problem)[0]


def exchange_header_eager(operation: str, text: str, sizes: list[int], describe_inputs: Callable[[], str],
                          state: Processes, hint: str = "", problem: str = SAME_INPUTS,
                          payload: Optional[torch.Tensor] = None) -> tuple[list[list[int]], Optional[torch.Tensor]]:
    """``exchange_header``, which can also carry a small ``payload`` (a 1-d uint8 tensor on ``state.device``
    of at most ``eager_bytes(world)``): returns ``(sizes per process, payloads)``, where ``payloads`` is a
    ``(world, eager_bytes(world))`` uint8 tensor when every process sent one, else None.

    ``text`` must cover the number of sizes. Up to ``HEADER_SLOTS - 2`` sizes travel in the header; more are
    replaced by their hash, and only when the hashes differ does a second all-gather fetch them. Every
    process sends the same number of bytes whatever it passes, so even different collectives called at the
    same point meet in this all-gather and raise, instead of aborting.
    """
    world = state.num_processes
    capacity = eager_bytes(world)
    row_bytes = _HEADER_BYTES + capacity
    inline = len(sizes) <= HEADER_SLOTS - 2
    fits = payload is not None and payload.numel() <= capacity
    header = [signature(f"{operation}: {text}"), payload.numel() if fits else -1]
    header += list(sizes) if inline else [signature(repr(list(sizes)))]
    header += [-1] * (HEADER_SLOTS - len(header))
    row = torch.zeros(row_bytes, dtype=torch.uint8, device=state.device)
    row[:_HEADER_BYTES].copy_(torch.tensor(header, dtype=torch.int64).view(torch.uint8))
    if fits and payload.numel():
        row[_HEADER_BYTES:_HEADER_BYTES + payload.numel()].copy_(payload)
    everyone = torch.empty(world * row_bytes, dtype=torch.uint8, device=state.device)
    _all_gather_flat(everyone, row, state)
    everyone = everyone.view(world, row_bytes)
    rows = everyone[:, :_HEADER_BYTES].cpu().contiguous().view(torch.int64).tolist()
    if any(other[0] != header[0] for other in rows):
        raise_mismatch(operation, describe_inputs(), state, hint, problem)
    payloads = everyone[:, _HEADER_BYTES:] if all(other[1] >= 0 for other in rows) else None
    if inline:
        return [other[2:2 + len(sizes)] for other in rows], payloads
    if all(other[2] == header[2] for other in rows):
        return [list(sizes)] * world, payloads
    all_sizes = torch.empty(world * len(sizes), dtype=torch.int64, device=state.device)
    _all_gather_flat(all_sizes, torch.tensor(sizes, dtype=torch.int64).to(state.device), state)
    return all_sizes.view(world, len(sizes)).tolist(), payloads


def check_same_everywhere(operation: str, data: NestedData, state: Processes, hint: str = "", extra: str = "",
                          payload: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """Raise ``DistributedOperationException`` on every rank unless all ranks pass the same structure, shapes,
    dtypes and device types (and the same ``extra`` text, such as a source rank). Returns every process's
    ``payload`` (see ``exchange_header_eager``) or None."""
    text = (data if isinstance(data, str) else describe(data, full_leaf)) + extra
    payloads = exchange_header_eager(operation, text, [], lambda: text, state, hint, payload=payload)[1]
    check_device_type(operation, data, state)
    return payloads


def check_device_type(operation: str, data: NestedData, state: Processes) -> None:
    """Tensors on another kind of device than the run communicates on: a clear error (the same on every rank
    once the signatures, which hold the device type, agree)."""
    if isinstance(data, str):
        return
    wrong = [leaf for leaf in leaves(data, []) if isinstance(leaf, torch.Tensor)
             and leaf.device.type != state.device.type]
    if wrong:
        raise DistributedOperationException(
            f"`{operation}` got tensors on {wrong[0].device.type} while this run communicates on "
            f"{state.device.type}: move them with `.to({state.device.type!r})` (or send_to_device) first."
        )
