"""Collectives and helpers that work on nested structures of tensors.

Every function takes a tensor or any nesting of list / tuple / namedtuple / dict / other ``Mapping`` of
tensors and returns the same structure (same container types). Each works in one process (where it means
the identity: ``gather`` returns its input, ``reduce`` a copy, ...) and across processes through
``torch.distributed`` collectives, knowing the ranks from ``PartialState``.

Mismatched shapes or dtypes across processes make the raw collectives abort the process (gloo) or silently
corrupt data. So, by default, gather, gather_object, broadcast, broadcast_object_list, reduce and
pad_across_processes first agree on a small header (collectives/checks.py) and raise
``DistributedOperationException`` on every rank, naming every rank's inputs, instead. The header also
carries the sizes that may differ, so ``gather`` takes tensors whose first dimension differs across ranks
and the object collectives and ``pad_across_processes`` pay no extra collective. ``HASTEN_DEBUG_MODE=0`` or
``set_collective_checks(False)`` turns the checks off (see docs/debugging.md).
"""
from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar, Union

import torch
import torch.distributed as dist

from ..core.aliases import Device, NestedData
from ..core.nested import honor_type, is_namedtuple
from ..core.nested import leaves as _leaves
from .checks import (
    ALIGN,
    DistributedOperationException,
    _all_gather_flat,
    check_device_type,
    check_same_everywhere,
    collective_checks,
    collective_checks_enabled,
    describe,
    eager_bytes,
    exchange_header,
    exchange_header_eager,
    full_leaf,
    gather_leaf,
    ndim_leaf,
    set_collective_checks,
)
from .object_exchange import broadcast_objects_checked, gather_objects_checked
from .process_view import group_of

__all__ = [
    "broadcast", "broadcast_object_list", "concatenate", "convert_to_fp32", "convert_outputs_to_fp32",
    "ConvertOutputsToFp32", "gather", "gather_object", "listify", "pad_across_processes", "recursively_apply",
    "reduce", "send_to_device", "slice_tensors", "find_batch_size", "ignorant_find_batch_size", "is_torch_tensor",
    "is_namedtuple", "honor_type", "find_device", "get_shape", "get_data_structure", "initialize_tensors",
    "TensorInformation", "is_tensor_information", "DistributedOperationException", "CannotPadNestedTensorWarning",
    "is_torch_xpu_tensor", "verify_operation", "chained_operation", "TENSOR_TYPE_TO_INT", "TENSOR_INT_TO_DTYPE",
    "collective_checks", "collective_checks_enabled", "set_collective_checks",
]

REDUCTIONS = ("mean", "sum", "max", "min", "none")

F = TypeVar("F", bound=Callable[..., Any])  # a decorated collective, returned with its signature


class CannotPadNestedTensorWarning(UserWarning):
    """``pad_across_processes`` met a nested (jagged) tensor, which it leaves as it is."""


@dataclass
class TensorInformation:
    """Shape and dtype of a tensor: enough to allocate a receive buffer for it."""

    shape: torch.Size
    dtype: torch.dtype


# --------------------------------------------------------------------------------------------- structure
def is_torch_tensor(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor)


def is_torch_xpu_tensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a tensor on an Intel XPU."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


# dtype <-> small int, to send a dtype inside an integer tensor (the reference's codes)
TENSOR_TYPE_TO_INT = {
    torch.float: 1, torch.double: 2, torch.half: 3, torch.bfloat16: 4, torch.uint8: 5, torch.int8: 6,
    torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.bool: 10,
}
TENSOR_INT_TO_DTYPE = {code: dtype for dtype, code in TENSOR_TYPE_TO_INT.items()}


def is_tensor_information(tensor_info: Any) -> bool:
    return isinstance(tensor_info, TensorInformation)


def _rebuild_mapping(original: Mapping, items: dict):
    """A mapping of ``original``'s type holding ``items``.

    Tries ``type(original)(items)`` first; types whose constructor does not take a dict (``defaultdict``,
    classes with extra required arguments) are copied and refilled instead, which keeps their extra state.
    """
    try:
        return type(original)(items)
    except TypeError:
        pass
    try:
        rebuilt = copy.copy(original)
        for key, value in items.items():
            rebuilt[key] = value
        return rebuilt
    except Exception as error:
        raise TypeError(
            f"Cannot rebuild a {type(original).__name__}: it can be neither built from a dict nor copied and "
            f"assigned to ({error}). Pass a plain dict instead."
        ) from error


def recursively_apply(func: Callable[..., Any], data: NestedData, *args: Any,
                      test_type: Callable[[Any], bool] = is_torch_tensor, error_on_other_type: bool = False,
                      **kwargs: Any) -> NestedData:
    """Apply ``func(leaf, *args, **kwargs)`` to every leaf of ``data`` for which ``test_type(leaf)`` is true.

    Containers (list, tuple, namedtuple, Mapping) are rebuilt with their own type. Other leaves are returned
    unchanged, or raise TypeError when ``error_on_other_type`` is set.
    """
    if isinstance(data, (tuple, list)):
        return honor_type(data, (recursively_apply(func, item, *args, test_type=test_type,
                                                   error_on_other_type=error_on_other_type, **kwargs)
                                 for item in data))
    if isinstance(data, Mapping):
        return _rebuild_mapping(data, {
            key: recursively_apply(func, value, *args, test_type=test_type,
                                   error_on_other_type=error_on_other_type, **kwargs)
            for key, value in data.items()
        })
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        name = getattr(func, "__name__", type(func).__name__)
        raise TypeError(  # the reference's words, which scripts compare whole
            f"Unsupported types ({type(data)}) passed to `{name}`. Only nested list/tuple/dicts of objects that are "
            f"valid for `{getattr(test_type, '__name__', test_type)}` should be passed."
        )
    return data


def _replace_leaves(data, new_leaves: list):
    """``data`` with its leaves replaced, in order, by ``new_leaves``."""
    remaining: Iterator = iter(new_leaves)
    return recursively_apply(lambda _leaf: next(remaining), data, test_type=lambda _leaf: True)


def _tensor_leaves(data, operation: str) -> list:
    """The leaves of ``data``, which must all be tensors (else a TypeError naming the offending type)."""
    leaves = _leaves(data, [])
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            hint = " Use gather_object for arbitrary Python objects." if operation == "gather" else ""
            raise TypeError(
                f"{operation} takes tensors or nested list/tuple/dict of tensors, but got a "
                f"{type(leaf).__name__} leaf.{hint}"
            )
    return leaves


def get_data_structure(data: NestedData) -> NestedData:
    """``data`` with every tensor replaced by its ``TensorInformation`` (to rebuild it on another process)."""
    return recursively_apply(lambda tensor: TensorInformation(shape=tensor.shape, dtype=tensor.dtype), data)


def get_shape(data: NestedData) -> NestedData:
    """``data`` with every tensor replaced by its shape as a list."""
    return recursively_apply(lambda tensor: list(tensor.shape), data)


def initialize_tensors(data_structure: NestedData, device: Optional[Device] = None) -> NestedData:
    """Empty tensors with the structure, shapes and dtypes described by ``data_structure`` (see
    ``get_data_structure``); on ``device`` (default CPU)."""
    return recursively_apply(lambda info: torch.empty(*info.shape, dtype=info.dtype, device=device), data_structure,
                             test_type=is_tensor_information)


def find_batch_size(data: NestedData) -> int:
    """Size of the first dimension of the first tensor found in ``data`` (depth first)."""
    if isinstance(data, (tuple, list, Mapping)) and len(data) == 0:
        raise ValueError(f"Cannot find the batch size of an empty {type(data).__name__}.")
    if isinstance(data, (tuple, list)):
        return find_batch_size(data[0])
    if isinstance(data, Mapping):
        return find_batch_size(next(iter(data.values())))
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"Can only find the batch size of tensors, got a {type(data).__name__}.")
    if data.ndim == 0:
        raise ValueError("Cannot find the batch size of a 0-d tensor: it has no batch dimension.")
    return data.shape[0]


def ignorant_find_batch_size(data: NestedData) -> Optional[int]:
    """``find_batch_size``, or None where it would raise."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def find_device(data: NestedData) -> Optional[torch.device]:
    """The device of the first tensor in ``data`` (depth first), or None when there is none."""
    if isinstance(data, Mapping):
        data = list(data.values())
    if isinstance(data, (tuple, list)):
        for item in data:
            device = find_device(item)
            if device is not None:
                return device
        return None
    if isinstance(data, torch.Tensor):
        return data.device
    return None


# --------------------------------------------------------------------------------------------- local helpers
def send_to_device(tensor: NestedData, device: Device, non_blocking: bool = False,
                   skip_keys: Optional[Union[str, list[str]]] = None) -> NestedData:
    """Move every tensor (and every object with a ``.to`` method) in ``tensor`` to ``device``.

    Values under a key in ``skip_keys`` (a str or list of str) of any Mapping stay where they are; a
    Mapping that has its own ``.to`` (e.g. ``BatchEncoding``) is moved with it unless ``skip_keys`` is given.
    """
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    if isinstance(tensor, Mapping) and (skip_keys or not hasattr(tensor, "to")):
        skip = skip_keys or ()
        return _rebuild_mapping(tensor, {
            key: value if key in skip else send_to_device(value, device, non_blocking, skip_keys)
            for key, value in tensor.items()
        })
    if isinstance(tensor, (tuple, list)):
        return honor_type(tensor, (send_to_device(item, device, non_blocking, skip_keys) for item in tensor))
    if hasattr(tensor, "to"):
        try:
            return tensor.to(device, non_blocking=non_blocking)
        except TypeError:  # a .to() that does not take non_blocking
            return tensor.to(device)
    return tensor


def slice_tensors(data: NestedData, tensor_slice: slice, process_index: Optional[int] = None,
                  num_processes: Optional[int] = None) -> NestedData:
    """``tensor[tensor_slice]`` for every tensor of ``data``.

    ``process_index`` and ``num_processes`` are unused; they make this the default ``slice_fn_for_dispatch``.
    """
    return recursively_apply(lambda tensor: tensor[tensor_slice], data)


def concatenate(data: Sequence[NestedData], dim: int = 0) -> NestedData:
    """Concatenate a list of structures that share one layout, leaf by leaf, along ``dim``.

    A list holding a single non-tensor item returns that item.
    """
    if not isinstance(data, (tuple, list)) or len(data) == 0:
        raise ValueError(f"concatenate takes a non-empty list of tensors or nested structures, got {data!r:.80}.")
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return _rebuild_mapping(first, {key: concatenate([d[key] for d in data], dim=dim) for key in first})
    if isinstance(first, torch.Tensor):
        return torch.cat(list(data), dim=dim)
    if len(data) == 1:
        return first
    raise TypeError(f"Can only concatenate tensors, got {type(first).__name__}.")


_LOW_PRECISION_FLOATS = (torch.float16, torch.bfloat16)


def listify(data: NestedData) -> NestedData:
    """Every tensor of ``data`` as plain Python numbers / nested lists (``tensor.tolist()``)."""

    def _to_list(tensor):
        tensor = tensor.detach().cpu()
        if tensor.is_floating_point() and tensor.dtype not in (torch.float16, torch.float32, torch.float64):
            tensor = tensor.float()  # bf16 and fp8 have no Python / NumPy counterpart
        return tensor.tolist()

    return recursively_apply(_to_list, data)


def _is_low_precision(leaf) -> bool:
    return (isinstance(leaf, torch.Tensor) or hasattr(leaf, "dtype")) and leaf.dtype in _LOW_PRECISION_FLOATS


def _to_fp32(leaf):
    return leaf.float()


def convert_to_fp32(tensor: NestedData) -> NestedData:
    """Every fp16 / bf16 tensor of ``tensor`` converted to fp32; everything else unchanged."""
    if type(tensor) is torch.Tensor:  # a model's usual output: no walk (this runs after every mixed-precision forward)
        return tensor.float() if tensor.dtype in _LOW_PRECISION_FLOATS else tensor
    return recursively_apply(_to_fp32, tensor, test_type=_is_low_precision)


class ConvertOutputsToFp32:
    """Callable wrapping a forward so its fp16 / bf16 outputs come back in fp32.

    ``__wrapped__`` is the original forward (so unwrapping helpers find it); it pickles when the forward does.
    """

    def __init__(self, model_forward: Callable[..., Any]):
        if not callable(model_forward):
            raise TypeError(f"convert_outputs_to_fp32 takes a callable, got {type(model_forward).__name__}.")
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args, **kwargs):
        return convert_to_fp32(self.model_forward(*args, **kwargs))


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> ConvertOutputsToFp32:
    """Wrap ``model_forward`` so that its half-precision outputs are returned in fp32."""
    return ConvertOutputsToFp32(model_forward)


# --------------------------------------------------------------------------------------------- process state
def _state():
    from ..state import PartialState  # hasten.state imports hasten.utils; import late to avoid a cycle

    return PartialState()


def _check_source(from_process, state, operation: str) -> None:
    if not isinstance(from_process, int) or isinstance(from_process, bool) or not (
            0 <= from_process < state.num_processes):
        raise ValueError(
            f"{operation}: from_process={from_process!r} is not a process of this run; use an int in "
            f"[0, {state.num_processes - 1}]."
        )


# --------------------------------------------------------------------------------------------- mismatch check
def verify_operation(function: F) -> F:
    """Decorator for a collective taking ``tensor`` first: on several processes, with the collective checks on
    (the default; see ``collective_checks_enabled``), check first that every process passes the same
    structure, shapes and dtypes, on the run's device type, and raise ``DistributedOperationException`` on
    every process, naming each one's inputs, when not. Otherwise the call goes straight through."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        state = _state()
        if state.use_distributed and collective_checks_enabled(state):
            tensor = kwargs["tensor"] if "tensor" in kwargs else args[0]
            check_same_everywhere(f"{function.__module__}.{function.__name__}", tensor, state)
        return function(*args, **kwargs)

    return wrapper


def chained_operation(function: F) -> F:
    """Decorator: a ``DistributedOperationException`` raised inside ``function`` is re-raised naming it, with
    the original error chained."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as error:
            operation = f"{function.__module__}.{function.__name__}"
            raise DistributedOperationException(
                f"Error found while calling `{operation}`. Please see the earlier error for more details."
            ) from error

    return wrapper


# --------------------------------------------------------------------------------------------- collectives
def _by_dtype_and_device(leaves: list) -> dict:
    groups: dict = {}
    for index, leaf in enumerate(leaves):
        groups.setdefault((leaf.dtype, leaf.device), []).append(index)
    return groups


_GATHER_HINT = ("\nOnly the first dimension may differ between processes; pad other dimensions with "
                "pad_across_processes(tensor, dim=...) before gathering.")


@torch.no_grad()
def gather(tensor: NestedData) -> NestedData:
    """All-gather every tensor of ``tensor`` from all processes and concatenate along dim 0.

    0-d tensors count as one element, so they come back 1-d (one value per process), in one process too.
    Dtypes and every dimension but the first must match on every process; the first may differ (each
    process's rows come back in rank order). With the collective checks off, every dimension must match.
    """
    return _gather(tensor, "gather")


def _first_size(leaf: torch.Tensor) -> int:
    return leaf.size(0) if leaf.ndim else 1


def _gather(tensor, operation: str, state=None):
    """``gather`` over ``state``'s processes: the run (default), or a ``ProcessView`` of a sub-group."""
    state = _state() if state is None else state
    if not state.use_distributed:
        _tensor_leaves(tensor, operation)
        return recursively_apply(lambda leaf: leaf if leaf.ndim else leaf.reshape(1), tensor)
    sizes = None
    if collective_checks_enabled(state):  # before any local error, so that every rank raises alike
        tensors = [leaf for leaf in _leaves(tensor, []) if isinstance(leaf, torch.Tensor)]
        sizes, payloads = exchange_header_eager(
            operation, describe(tensor, gather_leaf), [_first_size(leaf) for leaf in tensors],
            lambda: describe(tensor, full_leaf), state, _GATHER_HINT, payload=_packed(tensors, state))
        check_device_type(operation, tensor, state)
        _tensor_leaves(tensor, "gather")
        if payloads is not None:  # every process's data came with the header: nothing more to exchange
            return _replace_leaves(tensor, _unpacked(tensors, sizes, payloads))
    leaves = _tensor_leaves(tensor, "gather")
    world = state.num_processes
    gathered = [None] * len(leaves)
    for (dtype, device), indices in _by_dtype_and_device(leaves).items():
        if sizes is not None and any(row[i] != sizes[0][i] for row in sizes for i in indices):
            _gather_uneven(leaves, indices, sizes, gathered, state)
            continue
        shapes = [leaves[i].shape if leaves[i].ndim else torch.Size([1]) for i in indices]
        numels = [leaves[i].numel() for i in indices]
        flat = leaves[indices[0]].detach().reshape(-1) if len(indices) == 1 else torch.cat(
            [leaves[i].detach().reshape(-1) for i in indices])
        output = torch.empty(world * flat.numel(), dtype=dtype, device=device)
        if flat.numel() or sizes is None:  # unchecked: always enter, so a lone empty rank cannot hang the others
            _all_gather_flat(output, flat.contiguous(), state)
        per_rank = output.view(world, -1)
        offset = 0
        for index, shape, numel in zip(indices, shapes, numels):
            piece = per_rank[:, offset:offset + numel]
            gathered[index] = piece.reshape(world * shape[0], *shape[1:])
            offset += numel
    return _replace_leaves(tensor, gathered)


def _round_up(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _packed(tensors: list, state) -> "torch.Tensor | None":
    """The bytes of ``tensors`` (each piece aligned), when they are few enough to ride in the header
    exchange and all on the device the run communicates on; else None."""
    if any(leaf.device != state.device or leaf.layout != torch.strided or getattr(leaf, "is_nested", False)
           for leaf in tensors):
        return None
    total = sum(_round_up(leaf.numel() * leaf.element_size()) for leaf in tensors)
    if total > eager_bytes(state.num_processes):
        return None
    try:
        payload = torch.zeros(total, dtype=torch.uint8, device=state.device)
        offset = 0
        for leaf in tensors:
            nbytes = leaf.numel() * leaf.element_size()
            if nbytes:
                payload[offset:offset + nbytes].copy_(leaf.detach().contiguous().reshape(-1).view(torch.uint8))
            offset += _round_up(nbytes)
    except RuntimeError:  # a dtype without a byte view: send it the ordinary way (never raise before the header)
        return None
    return payload


def _unpacked(tensors: list, sizes: list, payloads: torch.Tensor) -> list:
    """Every process's pieces of ``tensors`` read back from the payloads, concatenated in rank order."""
    pieces = [[] for _ in tensors]
    for rank, row in enumerate(sizes):
        offset = 0
        for i, leaf in enumerate(tensors):
            rest = leaf.shape[1:] if leaf.ndim else torch.Size()
            shape = (row[i], *rest)
            nbytes = shape[0] * rest.numel() * leaf.element_size()
            piece = payloads[rank, offset:offset + nbytes]
            pieces[i].append(piece.view(leaf.dtype).view(shape) if nbytes else leaf.new_empty(shape))
            offset += _round_up(nbytes)
    return [torch.cat(parts) for parts in pieces]


def _gather_uneven(leaves: list, indices: list, sizes: list, gathered: list, state) -> None:
    """Gather leaves whose first dimension differs across ranks: pad each to the largest, all-gather once,
    then keep each rank's real rows."""
    world = state.num_processes
    largest = {i: max(row[i] for row in sizes) for i in indices}
    padded, rests = [], {}
    for i in indices:
        leaf = leaves[i].detach()
        leaf = leaf if leaf.ndim else leaf.reshape(1)  # 0-d: one row per process
        rests[i] = leaf.shape[1:]
        if leaf.shape[0] < largest[i]:
            leaf = torch.cat([leaf, leaf.new_zeros((largest[i] - leaf.shape[0], *leaf.shape[1:]))])
        padded.append(leaf.reshape(-1))
    flat = torch.cat(padded)
    output = torch.empty(world * flat.numel(), dtype=flat.dtype, device=flat.device)
    if flat.numel():  # the padded size is the same on every rank
        _all_gather_flat(output, flat, state)
    per_rank = output.view(world, -1)
    offset = 0
    for i in indices:
        rest = rests[i]
        numel = largest[i] * rest.numel()
        blocks = per_rank[:, offset:offset + numel].reshape(world, largest[i], *rest)
        gathered[i] = torch.cat([blocks[rank, :row[i]] for rank, row in enumerate(sizes)])
        offset += numel


def gather_object(object: Any) -> list[Any]:
    """All-gather picklable objects: a list (or tuple) from every process is concatenated into one list,
    any other object becomes one item per process."""
    return _gather_object(object, "gather_object")


def _gather_object(object: Any, operation: str, state=None):
    state = _state() if state is None else state
    is_sequence = isinstance(object, (list, tuple))
    if not state.use_distributed:
        return list(object) if is_sequence else [object]
    if collective_checks_enabled(state):
        everyone = gather_objects_checked(object, state, operation)
    else:
        everyone = [None] * state.num_processes
        dist.all_gather_object(everyone, object, group=group_of(state))
    if is_sequence:  # (unchecked) a rank that passed another kind of object is kept as one item
        return [item for part in everyone for item in (part if isinstance(part, (list, tuple)) else [part])]
    return everyone


@torch.no_grad()
def broadcast(tensor: NestedData, from_process: int = 0) -> NestedData:
    """Copy every tensor of ``tensor`` from process ``from_process`` into the same tensors of all the others,
    in place; returns ``tensor``. Shapes and dtypes must match on every process."""
    state = _state()
    payloads = None
    if state.use_distributed and collective_checks_enabled(state):
        tensors = [leaf for leaf in _leaves(tensor, []) if isinstance(leaf, torch.Tensor)]
        payloads = check_same_everywhere("broadcast", tensor, state, extra=f", from_process={from_process!r}",
                                         payload=_packed(tensors, state))
    _check_source(from_process, state, "broadcast")
    leaves = _tensor_leaves(tensor, "broadcast")
    if not state.use_distributed:
        return tensor
    receiving = state.process_index != from_process
    if payloads is not None:  # the sender's data came with the header
        if receiving:
            sizes = [[_first_size(leaf) for leaf in leaves]] * state.num_processes
            for leaf, values in zip(leaves, _unpacked(leaves, sizes[:1], payloads[from_process:from_process + 1])):
                leaf.copy_(values.view(leaf.shape))
        return tensor
    for indices in _by_dtype_and_device(leaves).values():
        group = [leaves[i] for i in indices]
        if len(group) == 1 and group[0].is_contiguous():
            dist.broadcast(group[0], src=from_process)
            continue
        flat = torch.cat([leaf.reshape(-1) for leaf in group])
        dist.broadcast(flat, src=from_process)
        if receiving:
            for leaf, piece in zip(group, flat.split([leaf.numel() for leaf in group])):
                leaf.copy_(piece.view(leaf.shape))
    return tensor


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace, in place, the items of ``object_list`` with those of process ``from_process``; returns it.

    Every process must pass a list of the same length (placeholders such as None on the receivers).
    """
    state = _state()
    if not isinstance(object_list, list):
        raise TypeError(
            f"broadcast_object_list fills a list in place; got a {type(object_list).__name__}. Pass a list."
        )
    if state.use_distributed and collective_checks_enabled(state):
        return broadcast_objects_checked(object_list, from_process, state)
    _check_source(from_process, state, "broadcast_object_list")
    if not state.use_distributed:
        return object_list
    dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def _reduce_dtype(dtype: torch.dtype, reduction: str) -> torch.dtype:
    """The dtype a leaf is reduced in: booleans count as integers for sum / mean, bytes for max / min."""
    if dtype == torch.bool:
        return torch.int64 if reduction in ("sum", "mean") else torch.uint8
    return dtype


@torch.no_grad()
def reduce(tensor: NestedData, reduction: str = "mean", scale: float = 1.0) -> NestedData:
    """Reduce every tensor of ``tensor`` across processes; returns new tensors, the inputs are not modified.

    ``reduction``: ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or ``"none"`` (no communication, a copy).
    ``scale`` multiplies the result. Integer and boolean tensors: ``"mean"`` returns floats (the default
    dtype), ``"sum"`` of booleans counts them (int64), ``"max"`` / ``"min"`` of booleans are any / all.
    """
    return _reduce(tensor, reduction, scale)


def _reduce(tensor, reduction: str, scale, state=None):
    """``reduce`` over ``state``'s processes: the run (default), or a ``ProcessView`` of a sub-group."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduce: unknown reduction {reduction!r}; use one of {', '.join(map(repr, REDUCTIONS))}.")
    state = _state() if state is None else state
    distributed = state.use_distributed and reduction != "none"
    checked = distributed and collective_checks_enabled(state)
    payloads = None
    if checked:
        tensors = [leaf for leaf in _leaves(tensor, []) if isinstance(leaf, torch.Tensor)]
        payloads = check_same_everywhere("reduce", tensor, state, extra=f", reduction={reduction!r}",
                                         payload=_packed(tensors, state))
    leaves = _tensor_leaves(tensor, "reduce")
    if payloads is not None:  # every process's data came with the header: reduce here
        return _reduce_gathered(tensor, leaves, payloads, reduction, scale, state.num_processes)
    world = state.num_processes if distributed else 1
    op = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(reduction, dist.ReduceOp.SUM)
    reduced = [None] * len(leaves)
    for (dtype, device), indices in _by_dtype_and_device(leaves).items():
        work_dtype = _reduce_dtype(dtype, reduction)
        flat = torch.cat([leaves[i].detach().reshape(-1).to(work_dtype) for i in indices])  # a fresh copy
        if distributed and (flat.numel() or not checked):  # unchecked: always enter (no lone-empty hang)
            dist.all_reduce(flat, op=op, group=group_of(state))
        if reduction == "mean":
            if not (flat.is_floating_point() or flat.is_complex()):
                flat = flat.to(torch.get_default_dtype())
            flat = flat / world
        elif work_dtype != dtype and reduction != "sum":
            flat = flat.to(dtype)  # booleans: max / min / none stay booleans
        for index, piece in zip(indices, flat.split([leaves[i].numel() for i in indices])):
            reduced[index] = piece.view(leaves[index].shape)
    if scale != 1.0:
        reduced = [leaf * scale for leaf in reduced]
    return _replace_leaves(tensor, reduced)


def _reduce_gathered(tensor, leaves: list, payloads: torch.Tensor, reduction: str, scale, world: int):
    """``reduce``'s result computed from every process's copy of the leaves (rank order: deterministic)."""
    sizes = [[_first_size(leaf) for leaf in leaves]] * world
    reduced = []
    for leaf, stacked in zip(leaves, _unpacked(leaves, sizes, payloads)):
        stacked = stacked.view(world, *leaf.shape).to(_reduce_dtype(leaf.dtype, reduction))
        if reduction == "max":
            out = stacked.amax(0)
        elif reduction == "min":
            out = stacked.amin(0)
        else:
            out = stacked.sum(0, dtype=stacked.dtype)
        if reduction == "mean":
            if not (out.is_floating_point() or out.is_complex()):
                out = out.to(torch.get_default_dtype())
            out = out / world
        elif out.dtype != leaf.dtype and reduction != "sum":
            out = out.to(leaf.dtype)
        reduced.append(out * scale if scale != 1.0 else out)
    return _replace_leaves(tensor, reduced)


def pad_across_processes(tensor: NestedData, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> NestedData:
    """Pad every tensor of ``tensor`` along ``dim`` to the largest size any process has, so they can be
    gathered; ``pad_index`` fills the new entries, at the end or (``pad_first``) at the front.

    Tensors with no dimension ``dim`` (0-d, or ``dim >= ndim``) and nested tensors are returned unchanged.
    The processes must pass the same structure with tensors of the same number of dimensions and dtypes;
    otherwise every process raises ``DistributedOperationException`` naming each one's shapes. This check
    always runs (the collective checks' switch does not turn it off): it travels with the size exchange.
    """
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"pad_across_processes: dim must be an int, got {dim!r}.")
    state = _state()
    leaves = _leaves(tensor, [])
    if any(getattr(leaf, "is_nested", False) for leaf in leaves):
        warnings.warn("pad_across_processes cannot pad a nested tensor; it is returned unchanged.",
                      CannotPadNestedTensorWarning, stacklevel=2)
    if not state.use_distributed:
        _tensor_leaves(tensor, "pad_across_processes")
        return tensor
    paddable = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)
                and not getattr(leaf, "is_nested", False) and -leaf.ndim <= dim < leaf.ndim]
    max_sizes = _exchange_sizes_checked(tensor, [leaves[i].shape[dim] for i in paddable], state, dim)
    _tensor_leaves(tensor, "pad_across_processes")  # structures agree now: every rank raises alike
    padded = list(leaves)
    for index, largest in zip(paddable, max_sizes):
        leaf = leaves[index]
        axis = dim % leaf.ndim
        if leaf.shape[axis] == largest:
            continue
        new_shape = list(leaf.shape)
        new_shape[axis] = largest
        out = leaf.new_full(new_shape, pad_index)
        start = largest - leaf.shape[axis] if pad_first else 0
        out.narrow(axis, start, leaf.shape[axis]).copy_(leaf)
        padded[index] = out
    return _replace_leaves(tensor, padded)


def _pad_leaf(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).replace('torch.', '')} {ndim_leaf(tensor)}"


def _exchange_sizes_checked(data, sizes: list, state, dim: int = 0) -> list:
    """The largest of each entry of ``sizes`` across processes, after checking, in the same all-gather, that
    every process passed the same structure with tensors of the same number of dimensions and dtypes."""
    everyone = exchange_header(
        "pad_across_processes", f"dim={dim} " + describe(data, _pad_leaf), sizes,
        lambda: describe(data, full_leaf), state,
        problem="the processes passed different structures, dtypes or tensors with different numbers of "
                "dimensions; only the sizes along `dim` may differ")
    return [max(column) for column in zip(*everyone)] if sizes else []
