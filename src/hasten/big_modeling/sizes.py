"""How big a model and its parts are, and how much memory each device may use for them.

Everything here works from shapes and dtypes only, so a model built under ``init_empty_weights`` (on the meta
device) can be measured without allocating anything.
"""
from __future__ import annotations

import logging
import re
from collections import defaultdict
from typing import Optional, Union

import torch
import torch.nn as nn

from .device_memory import accelerator_count, accelerator_type, available_memory
from .module_tensors import walk_modules

__all__ = ["convert_bytes", "compute_module_sizes", "compute_module_total_buffer_size", "get_max_layer_size", "get_max_memory",
           "get_balanced_memory", "convert_file_size_to_int", "dtype_byte_size", "calculate_maximum_sizes",
           "module_sizes_in_dtype"]

logger = logging.getLogger(__name__)

_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGTkmgt](?:i?[Bb]))\s*$")
_ONE_BYTE_FLOAT8 = {name for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                      "float8_e8m0fnu")}


def convert_file_size_to_int(size: Union[int, str]) -> int:
    """A size as a number of bytes: ``5000``, ``"5GB"`` (10**9), ``"1.5GiB"`` (2**30), ``"200KB"``, ``"10MiB"``.

    As in Accelerate, a lowercase final ``b`` after a decimal unit means bits: ``"8Mb"`` is 10**6 bytes.
    """
    if isinstance(size, bool):
        raise ValueError(f"Cannot read {size!r} as a size: write a number of bytes or a string like '5GB'.")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"A size cannot be negative (got {size}).")
        return size
    if isinstance(size, float):
        if size < 0 or size != size:
            raise ValueError(f"A size must be a non-negative number (got {size}).")
        return int(size)
    match = _SIZE.match(size) if isinstance(size, str) else None
    if match is None:
        raise ValueError(
            f"Cannot read {size!r} as a size: write an integer number of bytes or a number with a unit, like "
            "'5GB' (10**9 bytes), '200MiB' (2**20 bytes each) or '1.5GiB'."
        )
    number, unit = float(match.group(1)), match.group(2)
    value = int(number * _UNITS[unit.lower()])
    if unit.endswith("b") and "i" not in unit.lower():  # "Gb": gigabits
        value //= 8
    return value


def _as_dtype(dtype) -> torch.dtype:
    """``torch.float16``, ``"float16"`` or ``"torch.float16"`` -> ``torch.float16``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        found = getattr(torch, dtype.replace("torch.", ""), None)
        if isinstance(found, torch.dtype):
            return found
    raise ValueError(f"{dtype!r} is not a torch dtype: pass e.g. torch.float16 or 'float16'.")


def dtype_byte_size(dtype: torch.dtype) -> float:
    """Bytes taken by one element of ``dtype`` (``bool`` counts 1/8, as a packed bit, the way Accelerate plans;
    ``CustomDtype.INT4`` 1/2, ``INT2`` 1/4 and ``FP8`` 1, for quantized weights in device-map planning)."""
    custom = {"int4": 0.5, "int2": 0.25, "fp8": 1}.get(getattr(dtype, "value", None))
    if custom is not None and type(dtype).__name__ == "CustomDtype":
        return custom
    dtype = _as_dtype(dtype)
    if dtype == torch.bool:
        return 1 / 8
    name = str(dtype).split(".")[-1]
    if name in _ONE_BYTE_FLOAT8:
        return 1
    bits = re.search(r"[^\d](\d+)$", name)
    if bits is None:
        raise ValueError(f"`dtype` is not a valid dtype: {dtype}.")
    size = int(bits.group(1))
    return size // 8 if size % 8 == 0 else size / 8


def _is_integral(dtype: torch.dtype) -> bool:
    """Integer and bool tensors keep their dtype when a model is loaded in another dtype."""
    return not (dtype.is_floating_point or dtype.is_complex)


class _Sizer:
    """Bytes of one tensor given the load ``dtype`` and per-tensor ``special_dtypes``. A floating tensor takes the
    smaller of ``dtype`` and its own dtype (loading never upcasts, as device-map planning assumes), or, with
    ``convert``, exactly ``dtype``'s size, whatever dtype it was built in."""

    def __init__(self, dtype=None, special_dtypes=None, *, convert: bool = False):
        self.target = dtype_byte_size(dtype) if dtype is not None else None
        self.special = {k: dtype_byte_size(v) for k, v in (special_dtypes or {}).items()}
        self.convert = convert
        self._per_dtype: dict = {}

    def __call__(self, name: str, tensor: torch.Tensor):
        if name in self.special:
            return tensor.numel() * self.special[name]
        per_element = self._per_dtype.get(tensor.dtype)
        if per_element is None:
            own = dtype_byte_size(tensor.dtype)
            if self.target is None or _is_integral(tensor.dtype):
                per_element = own
            else:
                per_element = self.target if self.convert else min(self.target, own)
            self._per_dtype[tensor.dtype] = per_element
        return tensor.numel() * per_element


def _unique_tensors(walk, kind: str):
    """``(module name, tensor name, tensor)`` in ``named_parameters()`` / ``named_buffers()`` order, with the same
    de-duplication (each tensor once, under its first name)."""
    seen: set = set()
    for prefix, module in walk:
        for key, tensor in getattr(module, kind).items():
            if tensor is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            yield prefix, (f"{prefix}.{key}" if prefix else key), tensor


def compute_module_sizes(model: nn.Module, dtype: Optional[Union[str, torch.dtype]] = None,
                         special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
                         buffers_only: bool = False) -> dict[str, Union[int, float]]:
    """Bytes of every submodule and tensor of ``model``, keyed by dotted name (``""`` is the whole model).

    ``dtype`` is the dtype the weights will be loaded in (floating tensors never grow: the smaller of the two
    is counted); ``special_dtypes`` overrides it per tensor name. Tied weights are counted once, under their
    first name.
    """
    kinds = ("_buffers",) if buffers_only else ("_parameters", "_buffers")
    return _sizes(walk_modules(model), _Sizer(dtype, special_dtypes), kinds)


def module_sizes_in_dtype(model: nn.Module, dtype: Union[str, torch.dtype]) -> dict[str, Union[int, float]]:
    """Bytes of every submodule and tensor of ``model`` once stored in ``dtype``, keyed by dotted name (``""`` is
    the whole model), whatever dtype the model was built in (a meta model works).

    Every floating parameter and buffer counts its number of elements times ``dtype``'s bytes per element
    (``"int8"``: 1, ``"int4"``: 1/2, as plain per-element storage without quantization statistics); integer
    and bool tensors keep their own dtype's size. Tied weights are counted once, under their first name.
    ``hasten estimate-memory``'s float rows (total and largest layer) come from here.
    """
    return _sizes(walk_modules(model), _Sizer(dtype, convert=True), ("_parameters", "_buffers"))


def _sizes(walk, sizer: "_Sizer", kinds) -> dict:
    sizes: dict = defaultdict(int)
    own_bytes: dict[str, float] = {}
    chains: dict[str, list[str]] = {}
    for kind in kinds:
        for prefix, name, tensor in _unique_tensors(walk, kind):
            chain = chains.get(prefix)
            if chain is None:
                chain = chains[prefix] = _prefixes(prefix)
                for step in chain:
                    sizes.setdefault(step, 0)
            size = sizer(name, tensor)
            sizes[name] += size
            own_bytes[prefix] = own_bytes.get(prefix, 0) + size
    for prefix, size in own_bytes.items():
        for step in chains[prefix]:
            sizes[step] += size
    return sizes


def _prefixes(module_name: str) -> list[str]:
    """``"a.b"`` -> ``["", "a", "a.b"]``."""
    if not module_name:
        return [""]
    parts = module_name.split(".")
    return [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]


def compute_module_total_buffer_size(model: nn.Module, dtype: Optional[Union[str, torch.dtype]] = None,
                                     special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
                                     ) -> Union[int, float]:
    """Bytes of all the buffers of ``model``."""
    return compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True).get("", 0)


def _is_layer(module, no_split_module_classes) -> bool:
    """A layer is never split: a leaf module, a tensor, or an instance of a no-split class."""
    if not isinstance(module, nn.Module):
        return True
    return module.__class__.__name__ in no_split_module_classes or next(module.children(), None) is None


def get_max_layer_size(modules: list[tuple[str, Union[nn.Module, torch.Tensor]]],
                       module_sizes: dict[str, Union[int, float]],
                       no_split_module_classes: list[str]) -> tuple[Union[int, float], list[str]]:
    """The size of the largest layer among ``modules`` (``(name, module)`` pairs) and the names of the layers of
    that size, in model order. A layer is a module without children or whose class is in
    ``no_split_module_classes``."""
    best, names = 0, []
    pending = list(reversed(modules))
    while pending:
        name, module = pending.pop()
        if _is_layer(module, no_split_module_classes):
            size = module_sizes.get(name, 0)
            if size > best:
                best, names = size, [name]
            elif size == best:
                names.append(name)
        else:
            pending.extend(reversed([(f"{name}.{child}", sub) for child, sub in module.named_children()]))
    return best, names


def _normalise_key(key):
    """A ``max_memory`` key as Accelerate writes it: an int for a numbered accelerator, or mps/cpu/disk."""
    if isinstance(key, bool):
        raise ValueError(f"max_memory key {key!r} is not a device.")
    if isinstance(key, int):
        if key < 0:
            raise ValueError(f"max_memory key {key} is not a device index (indices start at 0).")
        return key
    if isinstance(key, torch.device):
        key = str(key)
    if isinstance(key, str):
        if key in ("mps", "cpu", "disk"):
            return key
        kind, _, index = key.partition(":")
        if kind in ("cuda", "xpu", "npu", "mlu", "musa") and index.isdigit():
            return int(index)
    raise ValueError(
        f"max_memory key {key!r} is not a device: use integers for GPUs/XPUs (0 means cuda:0), 'mps', 'cpu' or 'disk'."
    )


def get_max_memory(max_memory: Optional[dict] = None) -> dict:
    """The memory budget per device, in bytes, ordered GPUs first (by index), then mps, cpu and disk.

    With ``None``, the memory free right now on every device. Otherwise a new dict (the argument is never
    modified) with string sizes such as ``"10GiB"`` converted to bytes. Integer device ids are kept even when
    this machine lacks those devices, so a device map can be planned anywhere.
    """
    if max_memory is None:
        return available_memory()
    if not isinstance(max_memory, dict):
        raise ValueError(f"max_memory must be a dict like {{0: '10GiB', 'cpu': '30GiB'}}, got {type(max_memory).__name__}.")
    converted: dict = {}
    for key, value in max_memory.items():
        device = _normalise_key(key)
        if device in converted:
            raise ValueError(f"max_memory names device {device!r} twice (as {key!r} and another spelling).")
        try:
            converted[device] = convert_file_size_to_int(value) if isinstance(value, str) else value
        except ValueError as error:
            raise ValueError(f"max_memory[{key!r}]: {error}") from None
        if not isinstance(converted[device], (int, float)) or isinstance(converted[device], bool) or converted[device] < 0:
            raise ValueError(f"max_memory[{key!r}] = {value!r} is not a size: use a number of bytes or a string like '10GiB'.")
    gpus = sorted(k for k in converted if isinstance(k, int))
    present = accelerator_count()
    if accelerator_type() in ("cuda", "xpu"):
        for index in gpus:
            if index >= present:
                logger.warning("Device %d is not available (this machine has %d); planning for it anyway.", index, present)
    order = gpus + [k for k in ("mps", "cpu", "disk") if k in converted]
    return {k: converted[k] for k in order}


def get_balanced_memory(model: nn.Module, max_memory: Optional[dict] = None, no_split_module_classes: Optional[list[str]] = None,
                        dtype: Optional[Union[str, torch.dtype]] = None,
                        special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
                        low_zero: bool = False) -> dict:
    """A ``max_memory`` for ``infer_auto_device_map`` that spreads the model evenly over the GPUs instead of
    filling them one after the other. ``low_zero`` keeps GPU 0 as empty as possible (room for ``generate``).

    Each GPU but the last is capped at model size / number of GPUs plus a margin (1.25 x the largest of: the
    first block of each no-split class, the mean leaf-module size), so rounding never pushes layers off the
    GPUs. The argument is never modified.
    """
    user_set = max_memory is not None
    max_memory = get_max_memory(max_memory)
    counted = [k for k, v in max_memory.items() if v > 0 and (isinstance(k, int) or (k == "mps" and accelerator_type() == "mps"))]
    num_devices = len(counted)
    if num_devices == 0:
        return max_memory
    if num_devices == 1:
        low_zero = False
        if not user_set:  # keep 10% of the only GPU for activations
            first = next((k for k in max_memory if isinstance(k, int)), None)
            if first is not None:
                max_memory[first] = int(max_memory[first] * 0.9)
                logger.info("Using 90%% of device %s for weights and leaving 10%% for activations.", first)

    module_sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    total = module_sizes[""]
    per_gpu = total // (num_devices - 1 if low_zero else num_devices)

    no_split = _as_class_names(no_split_module_classes)
    block = 0
    if no_split:
        first_of_class: dict[str, float] = {}
        modules = dict(model.named_modules())
        for name, size in module_sizes.items():
            if name == "":
                continue
            target = modules.get(name)
            class_name = target.__class__.__name__ if target is not None else _tensor_class_name(model, name)
            if class_name in no_split and class_name not in first_of_class:
                first_of_class[class_name] = size
                if len(first_of_class) == len(set(no_split)):
                    break
        block = max(first_of_class.values(), default=0)

    leaves = _leaves(module_sizes)
    modules_only = {n: v for n, v in module_sizes.items() if n not in leaves}
    final_modules = _leaves(modules_only)
    mean_leaf = int(sum(modules_only[n] for n in final_modules) / max(len(final_modules), 1))
    per_gpu += int(1.25 * max(block, mean_leaf))

    gpus = sorted(k for k, v in max_memory.items() if isinstance(k, int) and v > 0)
    for index in gpus[:-1]:
        cap = max_memory[index] if (low_zero and index == gpus[0]) else per_gpu
        max_memory[index] = min(cap, max_memory[index])
    if low_zero:
        others = sum(max_memory[i] for i in gpus[1:num_devices])
        max_memory[gpus[0]] = min(max(0, total - others), max_memory[gpus[0]])
    return max_memory


def _tensor_class_name(model: nn.Module, name: str) -> str:
    """Class name of the parameter/buffer at ``name`` (sizes also list tensors, not only modules)."""
    target = model
    for step in name.split("."):
        target = getattr(target, step)
    return target.__class__.__name__


def _leaves(module_sizes: dict) -> set[str]:
    """Names in ``module_sizes`` that are nobody's parent (top-level names are nobody's child either)."""
    parents = {name.rsplit(".", 1)[0] for name in module_sizes if "." in name}
    return {name for name in module_sizes if name != "" and name not in parents}


def _as_class_names(classes) -> list[str]:
    if classes is None:
        return []
    if isinstance(classes, str):
        return [classes]
    return list(classes)


def calculate_maximum_sizes(model: nn.Module) -> tuple[Union[int, float], tuple[Union[int, float], list[str]]]:
    """``(total bytes, (largest layer bytes, its names))`` of a model, honouring ``model._no_split_modules``."""
    sizes = compute_module_sizes(model)
    no_split = getattr(model, "_no_split_modules", None) or []
    top = list(model.named_parameters(recurse=False)) + list(model.named_children()) + list(model.named_buffers(recurse=False))
    return sizes[""], get_max_layer_size(top, sizes, no_split)


def convert_bytes(size: float) -> str:
    """``size`` in bytes written in the largest unit below 1024 of it: ``convert_bytes(3 * 2**20) == "3.0 MB"``."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"
