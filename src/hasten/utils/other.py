"""Accelerate's ``utils.other``: compiled-model checks, regional compilation, small helpers.

Regional compilation is hasten's own (``hasten.compile``): ``compile_regions`` compiles the blocks of each
repeated stack in place, so parameters keep their identity. The reference's ``compile_regions`` returns a
new module wrapping ``torch.compile``d copies; here the same model comes back, compiled region by region.
Names that live elsewhere in hasten (``save``, ``load``, ``extract_model_from_parallel`` ...) are
re-exported, not copied.
"""
from __future__ import annotations

import functools
import logging
import platform
import re
import sys
from typing import Optional

from ..compile import compile_regions, repeated_block_containers
from .modeling import extract_model_from_parallel, get_module_children_bottom_up, id_tensor_storage
from ..core.network import find_free_port
from ..core.network import is_port_in_use
from .serialization import load, save

__all__ = ["is_compiled_module", "has_compiled_regions", "is_repeated_blocks", "has_repeated_blocks",
           "compile_regions", "compile_regions_deepspeed", "compile_regions_fsdp2", "model_has_dtensor",
           "get_model_tp_size", "extract_model_from_parallel", "wait_for_everyone", "clean_state_dict_for_safetensors",
           "save", "load", "TORCH_SAFE_GLOBALS", "get_pretty_name", "merge_dicts", "is_port_in_use", "get_free_port",
           "convert_bytes", "check_os_kernel", "recursive_getattr", "get_module_children_bottom_up"]

logger = logging.getLogger(__name__)

#: The oldest Linux kernel known not to make distributed runs hang.
MINIMUM_LINUX_KERNEL = "5.5.0"


# ----------------------------------------------------------------------------- compilation
def _optimized_module_type():
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # nothing was compiled if dynamo was never imported
    return getattr(eval_frame, "OptimizedModule", None)


def is_compiled_module(module) -> bool:
    """Whether ``module`` is the wrapper ``torch.compile(model)`` returns."""
    optimized = _optimized_module_type()
    return optimized is not None and isinstance(module, optimized)


def has_compiled_regions(module) -> bool:
    """Whether ``module`` or one of its submodules is compiled: wrapped by ``torch.compile`` or compiled in
    place (``nn.Module.compile``, what ``compile_regions`` does)."""
    if _optimized_module_type() is None:
        return False
    return any(is_compiled_module(sub) or getattr(sub, "_compiled_call_impl", None) is not None
               for sub in module.modules())


def is_repeated_blocks(module) -> bool:
    """Whether ``module`` is a stack that regional compilation compiles block by block: a ``ModuleList`` or
    ``Sequential`` of two or more children of one class."""
    containers = repeated_block_containers(module)
    return bool(containers) and containers[0] is module


def has_repeated_blocks(module) -> bool:
    """Whether ``module`` holds such a stack at any depth (itself included)."""
    return bool(repeated_block_containers(module))


def compile_regions_deepspeed(module, **compile_kwargs) -> None:
    """Regional compilation of a DeepSpeed engine's inner model, in place (hasten's ``compile_regions``)."""
    compile_regions(module, **compile_kwargs)


def compile_regions_fsdp2(module, **compile_kwargs):
    """Regional compilation in place, so hooks that ``fully_shard`` adds later still run; returns ``module``."""
    return compile_regions(module, **compile_kwargs)


# ----------------------------------------------------------------------------- distributed models
def model_has_dtensor(model) -> bool:
    """Whether any parameter of ``model`` is a ``DTensor`` (the model is sharded by FSDP2 or tensor parallel)."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def get_model_tp_size(model) -> Optional[int]:
    """The tensor-parallel degree a Transformers model was sharded with, or None.

    ``transformers < 5`` records it as ``model.tp_size``; later versions in ``model.config.distributed_config``.
    """
    tp_size = getattr(model, "tp_size", None)
    if tp_size is not None:
        return tp_size
    distributed_config = getattr(getattr(model, "config", None), "distributed_config", None)
    if isinstance(distributed_config, dict):
        return distributed_config.get("tp_size")
    return getattr(distributed_config, "tp_size", None)


def wait_for_everyone() -> None:
    """Block until every process reaches this point (``PartialState().wait_for_everyone()``)."""
    from ..state import PartialState

    PartialState().wait_for_everyone()


# ----------------------------------------------------------------------------- serialization
def clean_state_dict_for_safetensors(state_dict: dict) -> dict:
    """A state dict safetensors can write: each tensor once, contiguous and owning its memory.

    Names that are aliases of an earlier name (tied weights: the same tensor twice) are removed from
    ``state_dict`` itself, with a warning, as the reference does. Tensors that merely share memory with another
    (different views of one storage, e.g. a fused QKV weight split in three) are kept, each from its own copy:
    dropping them, as the reference does, would lose their data. Non-tensor values are kept as they are.
    """
    from .serialization import _tensors_for_safetensors

    first_name = {}
    aliases = []
    for name, value in state_dict.items():
        if not _is_tensor(value) or value.device.type == "meta" or value.numel() == 0:
            continue
        view = (id_tensor_storage(value), value.storage_offset(), value.dtype, tuple(value.shape),
                tuple(value.stride()))
        if view in first_name:
            aliases.append(name)
        else:
            first_name[view] = name
    for name in aliases:
        del state_dict[name]
    if aliases:
        logger.warning("Removed shared tensor %s while saving (tied weights, stored once). This is fine if the "
                       "model re-ties them when loading.", set(aliases))
    tensors = _tensors_for_safetensors({name: value for name, value in state_dict.items() if _is_tensor(value)})
    return {name: tensors.get(name, value) for name, value in state_dict.items()}


def _is_tensor(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def __getattr__(name: str):
    if name == "TORCH_SAFE_GLOBALS":
        # What torch.load(weights_only=True) is allowed to rebuild besides tensors: NumPy arrays and dtypes
        # (saved RNG states hold them). hasten.utils.load allows these by itself.
        from .serialization import _numpy_safe_globals

        value = _numpy_safe_globals()
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- small helpers
def get_pretty_name(obj) -> str:
    """A readable name for ``obj``: its ``__qualname__``/``__name__``, or that of its class."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    if hasattr(obj, "__qualname__"):
        return obj.__qualname__
    if hasattr(obj, "__name__"):
        return obj.__name__
    return str(obj)


def merge_dicts(source: dict, destination: dict) -> dict:
    """Merge ``source`` into ``destination`` recursively (nested dicts merged, other values replaced);
    returns ``destination``."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def get_free_port() -> int:
    """A TCP port that is free right now (the OS picks it)."""
    return find_free_port("")


def convert_bytes(size) -> str:
    """``size`` in bytes written in the largest unit below 1024 of it: ``convert_bytes(3 * 2**20) == "3.0 MB"``."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def _kernel_version(release: str) -> Optional[str]:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return f"{major}.{minor}.{patch or 0}"


def check_os_kernel() -> None:
    """Warn (on the main process) when the Linux kernel is older than 5.5, which can make processes hang."""
    from packaging.version import Version

    info = platform.uname()
    if info.system != "Linux":
        return
    version = _kernel_version(info.release)
    if version is None or Version(version) >= Version(MINIMUM_LINUX_KERNEL):
        return
    from ..state import PartialState

    if PartialState._shared_state and not PartialState().is_main_process:
        return
    logger.warning(
        "Detected kernel version %s, which is below the recommended minimum of %s; this can cause the process to "
        "hang. It is recommended to upgrade the kernel to the minimum version or higher.", version,
        MINIMUM_LINUX_KERNEL)


def recursive_getattr(obj, attr: str):
    """``getattr`` along a dotted path: ``recursive_getattr(model, "encoder.layer.0")``."""
    return functools.reduce(getattr, attr.split("."), obj)
