"""Collectives and helpers that work on nested structures of tensors.

Every function takes a tensor or any nesting of list / tuple / namedtuple / dict / other ``Mapping`` of
tensors and returns the same structure (same container types). Each works in one process (where it means
the identity: ``gather`` returns its input, ``reduce`` a copy, ...) and across processes through
``torch.distributed`` collectives, knowing the ranks from ``PartialState``.

Mismatched shapes or dtypes across processes make the raw collectives abort the process (gloo) or silently
corrupt data. With debug mode on (``HASTEN_DEBUG_MODE=1``, read once into ``PartialState().debug``), gather,
reduce, broadcast and broadcast_object_list first agree on a hash of their inputs' structure, shapes and
dtypes (one all-gather of one int64) and raise ``DistributedOperationException`` on every rank, naming every
rank's inputs, instead. It is off by default because it costs a large share of a small training step (see
docs/debugging.md and bench/bench_collectives.py). ``pad_across_processes`` always checks: its size exchange
carries the hash for free.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

__all__ = [
    "broadcast", "broadcast_object_list", "concatenate", "convert_to_fp32", "convert_outputs_to_fp32",
    "ConvertOutputsToFp32", "gather", "gather_object", "listify", "pad_across_processes", "recursively_apply",
    "reduce", "send_to_device", "slice_tensors", "find_batch_size", "ignorant_find_batch_size", "is_torch_tensor",
    "is_namedtuple", "honor_type", "find_device", "get_shape", "get_data_structure", "initialize_tensors",
    "TensorInformation", "is_tensor_information", "DistributedOperationException", "CannotPadNestedTensorWarning",
    "is_torch_xpu_tensor", "verify_operation", "chained_operation", "TENSOR_TYPE_TO_INT", "TENSOR_INT_TO_DTYPE",
    "gather_tensor_shape", "copy_tensor_to_devices", "pad_input_tensors", "GatheredParameters",
]

REDUCTIONS = ("mean", "sum", "max", "min", "none")


class DistributedOperationException(Exception):
    """A collective cannot run because the processes passed inputs that do not match."""


class CannotPadNestedTensorWarning(UserWarning):
    """``pad_across_processes`` met a nested (jagged) tensor, which it leaves as it is."""


@dataclass
class TensorInformation:
    """Shape and dtype of a tensor: enough to allocate a receive buffer for it."""

    shape: torch.Size
    dtype: torch.dtype


# --------------------------------------------------------------------------------------------- structure
def is_torch_tensor(tensor) -> bool:
    return isinstance(tensor, torch.Tensor)


def is_torch_xpu_tensor(tensor) -> bool:
    """Whether ``tensor`` is a tensor on an Intel XPU."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


# dtype <-> small int, to send a dtype inside an integer tensor (the reference's codes)
TENSOR_TYPE_TO_INT = {
    torch.float: 1, torch.double: 2, torch.half: 3, torch.bfloat16: 4, torch.uint8: 5, torch.int8: 6,
    torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.bool: 10,
}
TENSOR_INT_TO_DTYPE = {code: dtype for dtype, code in TENSOR_TYPE_TO_INT.items()}


def is_tensor_information(tensor_info) -> bool:
    return isinstance(tensor_info, TensorInformation)


def is_namedtuple(data) -> bool:
    """Whether ``data`` is a namedtuple instance (a tuple with ``_fields`` and ``_asdict``)."""
    return isinstance(data, tuple) and hasattr(data, "_fields") and hasattr(data, "_asdict")


def honor_type(obj, generator):
    """Build a container of ``obj``'s type (list, tuple, namedtuple, other tuple subclass) from ``generator``."""
    items = list(generator)
    if is_namedtuple(obj):
        return type(obj)(*items)
    return type(obj)(items)


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


def recursively_apply(func, data, *args, test_type=is_torch_tensor, error_on_other_type=False, **kwargs):
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
        raise TypeError(
            f"`{name}` got a {type(data).__name__} where it only accepts nested list/tuple/dict of objects "
            f"passing `{getattr(test_type, '__name__', test_type)}` (tensors by default)."
        )
    return data


def _leaves(data, out: list) -> list:
    """Append every non-container leaf of ``data`` to ``out``, in ``recursively_apply`` order."""
    if isinstance(data, (tuple, list)):
        for item in data:
            _leaves(item, out)
    elif isinstance(data, Mapping):
        for value in data.values():
            _leaves(value, out)
    else:
        out.append(data)
    return out


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


def get_data_structure(data):
    """``data`` with every tensor replaced by its ``TensorInformation`` (to rebuild it on another process)."""
    return recursively_apply(lambda tensor: TensorInformation(shape=tensor.shape, dtype=tensor.dtype), data)


def get_shape(data):
    """``data`` with every tensor replaced by its shape as a list."""
    return recursively_apply(lambda tensor: list(tensor.shape), data)


def initialize_tensors(data_structure, device=None):
    """Empty tensors with the structure, shapes and dtypes described by ``data_structure`` (see
    ``get_data_structure``); on ``device`` (default CPU)."""
    return recursively_apply(lambda info: torch.empty(*info.shape, dtype=info.dtype, device=device), data_structure,
                             test_type=is_tensor_information)


def find_batch_size(data) -> int:
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


def ignorant_find_batch_size(data):
    """``find_batch_size``, or None where it would raise."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def find_device(data):
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
def send_to_device(tensor, device, non_blocking=False, skip_keys=None):
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


def slice_tensors(data, tensor_slice, process_index=None, num_processes=None):
    """``tensor[tensor_slice]`` for every tensor of ``data``.

    ``process_index`` and ``num_processes`` are unused; they make this the default ``slice_fn_for_dispatch``.
    """
    return recursively_apply(lambda tensor: tensor[tensor_slice], data)


def concatenate(data, dim=0):
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


def listify(data):
    """Every tensor of ``data`` as plain Python numbers / nested lists (``tensor.tolist()``)."""

    def _to_list(tensor):
        tensor = tensor.detach().cpu()
        if tensor.is_floating_point() and tensor.dtype not in (torch.float16, torch.float32, torch.float64):
            tensor = tensor.float()  # bf16 and fp8 have no Python / NumPy counterpart
        return tensor.tolist()

    return recursively_apply(_to_list, data)


def convert_to_fp32(tensor):
    """Every fp16 / bf16 tensor of ``tensor`` converted to fp32; everything else unchanged."""

    def _is_low_precision(leaf):
        return (isinstance(leaf, torch.Tensor) or hasattr(leaf, "dtype")) and leaf.dtype in _LOW_PRECISION_FLOATS

    return recursively_apply(lambda leaf: leaf.float(), tensor, test_type=_is_low_precision)


class ConvertOutputsToFp32:
    """Callable wrapping a forward so its fp16 / bf16 outputs come back in fp32.

    ``__wrapped__`` is the original forward (so unwrapping helpers find it); it pickles when the forward does.
    """

    def __init__(self, model_forward: Callable):
        if not callable(model_forward):
            raise TypeError(f"convert_outputs_to_fp32 takes a callable, got {type(model_forward).__name__}.")
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args, **kwargs):
        return convert_to_fp32(self.model_forward(*args, **kwargs))


def convert_outputs_to_fp32(model_forward):
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


def _all_gather_flat(output: torch.Tensor, tensor: torch.Tensor, state) -> None:
    """All-gather the 1-d (or any-shaped) ``tensor`` of every rank into ``output``, rank after rank."""
    if hasattr(dist, "all_gather_single"):
        dist.all_gather_single(output, tensor)
    elif state.backend == "gloo":  # older gloo builds lack the single-tensor form
        dist.all_gather(list(output.chunk(state.num_processes)), tensor)
    else:
        dist.all_gather_into_tensor(output, tensor)


# --------------------------------------------------------------------------------------------- mismatch check
def _describe(data, leaf: Callable[[torch.Tensor], str]) -> str:
    """A compact, deterministic text of ``data``'s structure with each tensor written by ``leaf``."""
    if isinstance(data, torch.Tensor):
        return leaf(data)
    if is_namedtuple(data):
        return f"{type(data).__name__}({', '.join(_describe(item, leaf) for item in data)})"
    if isinstance(data, (tuple, list)):
        body = ", ".join(_describe(item, leaf) for item in data)
        return f"({body})" if isinstance(data, tuple) else f"[{body}]"
    if isinstance(data, Mapping):
        prefix = "" if type(data) is dict else type(data).__name__
        return prefix + "{" + ", ".join(f"{key!r}: {_describe(value, leaf)}" for key, value in data.items()) + "}"
    return f"<{type(data).__name__}>"


def _full_leaf(tensor: torch.Tensor) -> str:
    text = f"{str(tensor.dtype).replace('torch.', '')}{list(tensor.shape)}"
    return text if tensor.device.type == "cpu" else f"{text} on {tensor.device.type}"


def _ndim_leaf(tensor: torch.Tensor) -> str:
    return "nested" if getattr(tensor, "is_nested", False) else f"{tensor.ndim}d"


def _signature(text: str) -> int:
    """A 63-bit hash of ``text`` that is the same in every process (unlike ``hash``, which is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


_SAME_INPUTS = "the processes passed inputs whose structure, shapes or dtypes differ, and they must match"


def _raise_mismatch(operation: str, description: str, state, hint: str = "", problem: str = _SAME_INPUTS) -> None:
    """Every rank calls this after seeing different signatures: share the descriptions and raise everywhere."""
    descriptions = [None] * state.num_processes
    dist.all_gather_object(descriptions, description)
    lines = "\n".join(f"  - process {rank}: {text}" for rank, text in enumerate(descriptions))
    raise DistributedOperationException(f"Cannot run `{operation}`: {problem}.\n{lines}{hint}")


def _check_same_everywhere(operation: str, data, state, hint: str = "") -> None:
    """Debug-mode check: raise DistributedOperationException on every rank unless all inputs match."""
    description = data if isinstance(data, str) else _describe(data, _full_leaf)
    mine = torch.tensor([_signature(description)], dtype=torch.int64, device=state.device)
    everyone = torch.empty(state.num_processes, dtype=torch.int64, device=state.device)
    _all_gather_flat(everyone, mine, state)
    if len(set(everyone.tolist())) > 1:
        _raise_mismatch(operation, description, state, hint)
    wrong = [leaf for leaf in _leaves(data, []) if isinstance(leaf, torch.Tensor)
             and leaf.device.type != state.device.type]
    if wrong:  # same on every rank once the descriptions agree
        raise DistributedOperationException(
            f"`{operation}` got tensors on {wrong[0].device.type} while this run communicates on "
            f"{state.device.type}: move them with `.to({state.device.type!r})` (or send_to_device) first."
        )


def verify_operation(function):
    """Decorator for a collective taking ``tensor`` first: in debug mode (``PartialState().debug``) on several
    processes, check first that every process passes the same structure, shapes and dtypes, on the run's
    device type, and raise ``DistributedOperationException`` on every process, naming each one's inputs,
    when not. Otherwise the call goes straight through."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        state = _state()
        if state.use_distributed and state.debug:
            tensor = kwargs["tensor"] if "tensor" in kwargs else args[0]
            _check_same_everywhere(f"{function.__module__}.{function.__name__}", tensor, state)
        return function(*args, **kwargs)

    return wrapper


def chained_operation(function):
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


@torch.no_grad()
def gather(tensor):
    """All-gather every tensor of ``tensor`` from all processes and concatenate along dim 0.

    0-d tensors count as one element, so they come back 1-d (one value per process), in one process too.
    Shapes and dtypes must match on every process (use ``pad_across_processes`` for uneven sizes).
    """
    state = _state()
    if state.use_distributed and state.debug:  # before any local error, so that every rank raises alike
        _check_same_everywhere("gather", tensor, state,
                               "\nPad uneven tensors with pad_across_processes before gathering them.")
    leaves = _tensor_leaves(tensor, "gather")
    if not state.use_distributed:
        return recursively_apply(lambda leaf: leaf if leaf.ndim else leaf.reshape(1), tensor)
    world = state.num_processes
    gathered = [None] * len(leaves)
    for (dtype, device), indices in _by_dtype_and_device(leaves).items():
        shapes = [leaves[i].shape if leaves[i].ndim else torch.Size([1]) for i in indices]
        numels = [leaves[i].numel() for i in indices]
        flat = leaves[indices[0]].detach().reshape(-1) if len(indices) == 1 else torch.cat(
            [leaves[i].detach().reshape(-1) for i in indices])
        output = torch.empty(world * flat.numel(), dtype=dtype, device=device)
        if flat.numel():
            _all_gather_flat(output, flat.contiguous(), state)
        per_rank = output.view(world, -1)
        offset = 0
        for index, shape, numel in zip(indices, shapes, numels):
            piece = per_rank[:, offset:offset + numel]
            gathered[index] = piece.reshape(world * shape[0], *shape[1:])
            offset += numel
    return _replace_leaves(tensor, gathered)


def gather_object(object: Any):
    """All-gather picklable objects: a list (or tuple) from every process is concatenated into one list,
    any other object becomes one item per process."""
    state = _state()
    is_sequence = isinstance(object, (list, tuple))
    if not state.use_distributed:
        return list(object) if is_sequence else [object]
    everyone = [None] * state.num_processes
    dist.all_gather_object(everyone, object)
    if is_sequence:  # every rank passes the same kind; a rank that did not is kept as one item
        return [item for part in everyone for item in (part if isinstance(part, (list, tuple)) else [part])]
    return everyone


@torch.no_grad()
def broadcast(tensor, from_process: int = 0):
    """Copy every tensor of ``tensor`` from process ``from_process`` into the same tensors of all the others,
    in place; returns ``tensor``. Shapes and dtypes must match on every process."""
    state = _state()
    _check_source(from_process, state, "broadcast")
    if state.use_distributed and state.debug:
        _check_same_everywhere("broadcast", tensor, state)
    leaves = _tensor_leaves(tensor, "broadcast")
    if not state.use_distributed:
        return tensor
    receiving = state.process_index != from_process
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


def broadcast_object_list(object_list, from_process: int = 0):
    """Replace, in place, the items of ``object_list`` with those of process ``from_process``; returns it.

    Every process must pass a list of the same length (placeholders such as None on the receivers).
    """
    state = _state()
    _check_source(from_process, state, "broadcast_object_list")
    if not isinstance(object_list, list):
        raise TypeError(
            f"broadcast_object_list fills a list in place; got a {type(object_list).__name__}. Pass a list."
        )
    if not state.use_distributed:
        return object_list
    if state.debug:
        _check_same_everywhere("broadcast_object_list", f"list of {len(object_list)} objects", state)
    dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def _reduce_dtype(dtype: torch.dtype, reduction: str) -> torch.dtype:
    """The dtype a leaf is reduced in: booleans count as integers for sum / mean, bytes for max / min."""
    if dtype == torch.bool:
        return torch.int64 if reduction in ("sum", "mean") else torch.uint8
    return dtype


@torch.no_grad()
def reduce(tensor, reduction="mean", scale=1.0):
    """Reduce every tensor of ``tensor`` across processes; returns new tensors, the inputs are not modified.

    ``reduction``: ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or ``"none"`` (no communication, a copy).
    ``scale`` multiplies the result. Integer and boolean tensors: ``"mean"`` returns floats (the default
    dtype), ``"sum"`` of booleans counts them (int64), ``"max"`` / ``"min"`` of booleans are any / all.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduce: unknown reduction {reduction!r}; use one of {', '.join(map(repr, REDUCTIONS))}.")
    state = _state()
    distributed = state.use_distributed and reduction != "none"
    if distributed and state.debug:
        _check_same_everywhere("reduce", tensor, state)
    leaves = _tensor_leaves(tensor, "reduce")
    world = state.num_processes if distributed else 1
    op = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(reduction, dist.ReduceOp.SUM)
    reduced = [None] * len(leaves)
    for (dtype, device), indices in _by_dtype_and_device(leaves).items():
        work_dtype = _reduce_dtype(dtype, reduction)
        flat = torch.cat([leaves[i].detach().reshape(-1).to(work_dtype) for i in indices])  # a fresh copy
        if distributed and flat.numel():
            dist.all_reduce(flat, op=op)
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


def pad_across_processes(tensor, dim=0, pad_index=0, pad_first=False):
    """Pad every tensor of ``tensor`` along ``dim`` to the largest size any process has, so they can be
    gathered; ``pad_index`` fills the new entries, at the end or (``pad_first``) at the front.

    Tensors with no dimension ``dim`` (0-d, or ``dim >= ndim``) and nested tensors are returned unchanged.
    The processes must pass the same structure with tensors of the same number of dimensions; otherwise every
    process raises ``DistributedOperationException`` naming each one's shapes.
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
    max_sizes = _exchange_sizes_checked(tensor, [leaves[i].shape[dim] for i in paddable], state)
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


_HEADER = 16  # int64 slots: the signature, then up to 15 sizes; more sizes take a second all-gather


def _exchange_sizes_checked(data, sizes: list, state) -> list:
    """The largest of each entry of ``sizes`` across processes, after checking that every process passed the
    same structure with tensors of the same number of dimensions (in the same collective, for free)."""
    signature = _signature(_describe(data, _ndim_leaf))
    header = torch.full((_HEADER,), -1, dtype=torch.int64)
    header[0] = signature
    inline = sizes[:_HEADER - 1]
    if inline:
        header[1:1 + len(inline)] = torch.tensor(inline, dtype=torch.int64)
    everyone = torch.empty(state.num_processes * _HEADER, dtype=torch.int64, device=state.device)
    _all_gather_flat(everyone, header.to(state.device), state)
    everyone = everyone.view(state.num_processes, _HEADER).cpu()
    if len(set(everyone[:, 0].tolist())) > 1:
        _raise_mismatch("pad_across_processes", _describe(data, _full_leaf), state,
                        problem="the processes passed different structures or tensors with different numbers of "
                                "dimensions; only the sizes along `dim` may differ")
    if len(sizes) < _HEADER:
        return everyone[:, 1:1 + len(sizes)].max(dim=0).values.tolist()
    rest = torch.tensor(sizes, dtype=torch.int64, device=state.device)
    all_sizes = torch.empty(state.num_processes * len(sizes), dtype=torch.int64, device=state.device)
    _all_gather_flat(all_sizes, rest, state)
    return all_sizes.view(state.num_processes, -1).max(dim=0).values.tolist()



@contextlib.contextmanager
def GatheredParameters(params, modifier_rank=None, fwd_module=None, enabled=True):
    """Gather DeepSpeed ZeRO-3 partitioned ``params`` for the duration of the block
    (``deepspeed.zero.GatheredParameters``); a no-op context in every other setting, where parameters are
    whole already."""
    from ..config.enums import DistributedType
    from ..state import AcceleratorState

    context = contextlib.nullcontext()
    state = AcceleratorState() if AcceleratorState._shared_state else None
    if state is not None and state.distributed_type == DistributedType.DEEPSPEED:
        plugin = getattr(state, "deepspeed_plugin", None)
        if plugin is None or plugin.is_zero3_init_enabled():
            from .imports import require_extra

            deepspeed = require_extra("deepspeed", "GatheredParameters under ZeRO-3")
            context = deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank, fwd_module=fwd_module,
                                                        enabled=enabled)
    with context:
        yield


def __getattr__(name: str):
    # Pipeline-inference helpers live in pipeline_io.py, which builds on this module.
    if name in ("gather_tensor_shape", "copy_tensor_to_devices", "pad_input_tensors"):
        from . import pipeline_io

        return getattr(pipeline_io, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
