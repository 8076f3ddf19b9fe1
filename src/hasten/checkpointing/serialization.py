"""``save`` and ``load``: ``torch.save``/``torch.load`` made safe for multi-process runs.

* Only the main process writes (or the local main process of each machine with ``save_on_each_node``), so
  N processes never race on one file.
* Files are written atomically: to a temporary file in the same folder, flushed to disk, then renamed over
  the target. A save that fails half-way (a tensor that cannot be pickled, a full disk, a killed process)
  leaves the previous file untouched.
* ``load`` uses ``torch.load(weights_only=True)`` unless told otherwise, so loading a checkpoint cannot
  run arbitrary code; NumPy arrays (as in saved RNG states) are allowed.
"""
from __future__ import annotations

import codecs
import contextlib
import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Optional, Union

import numpy as np
import torch

from ..core.modules import id_tensor_storage
from ..state import PartialState

__all__ = ["save", "load", "clean_state_dict_for_safetensors"]

logger = logging.getLogger(__name__)

_SAFETENSORS_SUFFIX = ".safetensors"

#: where ``torch.load`` puts what it reads: a device (a string, an index, a ``torch.device``), a dict mapping saved
#: devices to others, or a function of (storage, saved location)
MapLocation = Union[str, int, torch.device, dict, Callable[..., Any]]


# ----------------------------------------------------------------------------- writing
def _is_path(f) -> bool:
    return isinstance(f, (str, os.PathLike))


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``, on failure it is removed."""
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"Cannot save to {path}: the folder {folder} does not exist. Create it first.")
    temporary = folder / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        yield temporary
        fsync_file(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise


def fsync_file(path: Path) -> None:
    """Flush a written file's data to the disk (so a crash after a rename cannot lose it)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _owns_its_storage(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is contiguous and spans its whole storage (what safetensors can write as is)."""
    storage = tensor.untyped_storage()
    return (tensor.is_contiguous() and tensor.data_ptr() == storage.data_ptr()
            and storage.nbytes() == tensor.numel() * tensor.element_size())


def _check_safetensors_input(obj) -> None:
    """``obj`` must be a ``{str: Tensor}`` mapping of dense tensors (checked on every process, so all fail alike)."""
    if not isinstance(obj, Mapping):
        raise TypeError(
            f"safe_serialization=True saves a dict of tensors (like a state_dict), got {type(obj).__name__}. "
            "Pass a dict of tensors, or use safe_serialization=False to pickle other objects."
        )
    bad = [key for key, value in obj.items() if not isinstance(key, str) or not isinstance(value, torch.Tensor)]
    if bad:
        raise TypeError(
            f"safe_serialization=True needs string keys and tensor values; these entries are not: {bad[:10]}. "
            "Use safe_serialization=False to pickle other objects."
        )
    sparse = [key for key, value in obj.items() if value.layout != torch.strided]
    if sparse:
        raise TypeError(f"safetensors cannot store sparse tensors {sparse[:10]}; call .to_dense() first.")


def _tensors_for_safetensors(obj) -> dict:
    """Make a checked state dict writable by safetensors.

    safetensors refuses tensors that share memory (tied weights), that are views of part of a storage, or
    that are not contiguous. Rather than drop aliases (then a strict ``load_state_dict`` fails on the missing
    keys), every key is kept: each such tensor is written from its own contiguous copy.
    """
    seen, result, copied = set(), {}, []
    for key, tensor in obj.items():
        tensor = tensor.detach()
        if tensor.numel() == 0 or tensor.device.type == "meta":
            result[key] = tensor
            continue
        storage = (tensor.device, tensor.untyped_storage().data_ptr())
        if storage in seen or not _owns_its_storage(tensor):
            tensor = tensor.clone(memory_format=torch.contiguous_format)
            copied.append(key)
        seen.add(storage)
        result[key] = tensor
    if copied:
        logger.info("Saved %s from their own copies (shared, partial or non-contiguous tensors).", copied)
    return result


def _write(obj, target, safe_serialization: bool) -> None:
    """Write ``obj`` (already prepared by ``_tensors_for_safetensors`` when ``safe_serialization``) to ``target``."""
    if safe_serialization:
        from safetensors.torch import save, save_file

        tensors = obj
        if _is_path(target):
            save_file(tensors, str(target), metadata={"format": "pt"})
        else:
            target.write(save(tensors, metadata={"format": "pt"}))
    else:
        torch.save(obj, target)


def save(obj: Any, f: Union[str, os.PathLike, IO[bytes]], save_on_each_node: bool = False,
         safe_serialization: bool = False) -> None:
    """Save ``obj`` to ``f`` from one process only, atomically.

    Parameters:
        obj: what to save; with ``safe_serialization`` a dict of tensors (a state dict).
        f: a path, or an open binary file (written directly, no atomic rename).
        save_on_each_node: write on the local main process of every machine (for machines that do not share
            a file system) instead of on the global main process only.
        safe_serialization: write a safetensors file instead of a pickle. Tensors that share memory (tied
            weights) are stored as separate copies, so no key is lost.
    """
    if safe_serialization:
        _check_safetensors_input(obj)  # on every process, before anything touches the disk
    state = PartialState()
    writer = state.is_local_main_process if save_on_each_node else state.is_main_process
    if not writer:
        return
    if safe_serialization:
        obj = _tensors_for_safetensors(obj)
    if not _is_path(f):
        _write(obj, f, safe_serialization)
        return
    with atomic_file(Path(f)) as temporary:
        _write(obj, temporary, safe_serialization)


# ----------------------------------------------------------------------------- reading
def _numpy_safe_globals() -> list:
    """NumPy reconstructors that only build plain arrays and scalars (needed for saved NumPy RNG states)."""
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype, codecs.encode]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        allowed += [getattr(dtypes, name) for name in dir(dtypes)
                    if name.endswith("DType") and name not in ("ObjectDType", "VoidDType")]
    return allowed


def _load_safetensors(path, map_location, kwargs: dict):
    from safetensors.torch import load_file

    kwargs = {key: value for key, value in kwargs.items() if key != "weights_only"}  # always weights only
    if kwargs:
        raise TypeError(f"load() got options that do not apply to safetensors files: {sorted(kwargs)}.")
    if map_location is None:
        device = "cpu"
    elif isinstance(map_location, (str, int, torch.device)):
        device = str(torch.device(map_location)) if not isinstance(map_location, int) else map_location
    else:
        raise TypeError(
            f"map_location for a safetensors file must be a device (str, int or torch.device), got "
            f"{type(map_location).__name__}; load to 'cpu' and move tensors yourself."
        )
    return load_file(str(path), device=device)


def load(f: Union[str, os.PathLike, IO[bytes]], map_location: Optional[MapLocation] = None, **kwargs: Any) -> Any:
    """Load what ``save`` (or ``torch.save`` / safetensors) wrote.

    ``.safetensors`` files are read with safetensors. Anything else goes to ``torch.load`` with
    ``weights_only=True`` unless you pass ``weights_only=False`` (only for files you trust: unpickling can
    run code). ``kwargs`` are passed to ``torch.load``.
    """
    if _is_path(f) and str(f).endswith(_SAFETENSORS_SUFFIX):
        return _load_safetensors(f, map_location, kwargs)
    kwargs.setdefault("weights_only", True)
    if not kwargs["weights_only"]:
        return torch.load(f, map_location=map_location, **kwargs)
    with torch.serialization.safe_globals(_numpy_safe_globals()):
        return torch.load(f, map_location=map_location, **kwargs)


def clean_state_dict_for_safetensors(state_dict: dict) -> dict:
    """A state dict safetensors can write: each tensor once, contiguous and owning its memory.

    Names that are aliases of an earlier name (tied weights: the same tensor twice) are removed from
    ``state_dict`` itself, with a warning, as the reference does. Tensors that merely share memory with another
    (different views of one storage, e.g. a fused QKV weight split in three) are kept, each from its own copy:
    dropping them, as the reference does, would lose their data. Non-tensor values are kept as they are.
    """

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
    return isinstance(value, torch.Tensor)


def __getattr__(name: str):
    if name == "TORCH_SAFE_GLOBALS":
        # What torch.load(weights_only=True) is allowed to rebuild besides tensors: NumPy arrays and dtypes
        # (saved RNG states hold them). hasten.utils.load allows these by itself.
        from .serialization import _numpy_safe_globals

        value = _numpy_safe_globals()
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
