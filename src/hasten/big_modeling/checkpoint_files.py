"""Finding the files of a checkpoint and reading tensors out of them one at a time.

A safetensors file is read through one copy-on-write memory map of it (``SafetensorsFile.tensors``). The loader
says, per tensor, which kind it wants:

* kept: a zero-copy view of the file's pages, for tensors that stay on the CPU in their file dtype. They never
  cost more RAM than the file, and the pages are shared with the page cache.
* passed on: a view the caller copies (converts to another dtype, sends to another device, writes to the offload
  folder) before it asks for the next tensor; the pages it read are then handed back to the OS, so the process
  holds the copies and not the file besides. Measured against reading such tensors into fresh memory
  (``bench/bench_big_modeling.py``), mapping is about twice as fast, from the page cache or from disk: a page
  fault on the file maps several pages at once, while fresh memory faults in page by page.

The pages of the next tensors, up to ``_READ_AHEAD`` bytes beyond the one handed out, are asked for in the background
(``MADV_WILLNEED``) and the file is marked for sequential reading, so a file not yet in the page cache is read at
the disk's speed while the caller converts or uses the tensors before: loading a cold 0.8 GB file as bfloat16 took
0.4 s this way against 1.3-1.5 s asking for each tensor's pages only as it was handed out, and 0.6-0.7 s for
safetensors' own reader.

Tensors of a dtype this reader does not know, files on a big-endian machine, and tensors not aligned to their
element size come from safetensors' own reader instead.
"""
from __future__ import annotations

import json
import logging
import math
import mmap
import os
import struct
import sys
from typing import Callable, Iterable, Iterator, Optional, Union

import torch

logger = logging.getLogger(__name__)

#: how far ahead of the tensor being handed out its file's pages are asked for (measured: 64-256 MB alike)
_READ_AHEAD = 128 << 20

WEIGHTS_NAME = "pytorch_model.bin"
SAFE_WEIGHTS_NAME = "model.safetensors"

_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "U16": "uint16", "U32": "uint32", "U64": "uint64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu", "C64": "complex64",
}


def resolve_checkpoint_files(checkpoint: Union[str, os.PathLike]) -> list[str]:
    """The weight files of ``checkpoint``: a state-dict file, a sharded index ``.json``, or a folder holding
    ``model.safetensors`` / ``pytorch_model.bin`` or exactly one ``*.index.json`` and its shards. Every file is
    checked to exist before anything is read."""
    path = os.fspath(checkpoint)
    if os.path.isfile(path):
        return _index_files(path) if path.endswith(".json") else [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"Checkpoint {path!r} does not exist: pass a state-dict file (.safetensors / .bin), a sharded index "
            "(.index.json) or a folder containing one."
        )
    names = os.listdir(path)
    for whole in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
        if whole in names:
            return [os.path.join(path, whole)]
    indexes = sorted(name for name in names if name.endswith(".index.json"))
    preferred = [name for name in indexes if name.endswith(".safetensors.index.json")]
    if len(preferred) == 1:
        indexes = preferred
    if not indexes:
        raise ValueError(
            f"{path} holds neither {SAFE_WEIGHTS_NAME}, {WEIGHTS_NAME} nor a sharded checkpoint index (*.index.json)."
        )
    if len(indexes) > 1:
        raise ValueError(f"{path} holds several checkpoint indexes ({', '.join(indexes)}): pass the one to load.")
    return _index_files(os.path.join(path, indexes[0]))


def _index_files(index_path: str) -> list[str]:
    with open(index_path, encoding="utf-8") as handle:
        try:
            index = json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(f"{index_path} is not a valid checkpoint index (JSON error: {error}).") from None
    weight_map = index.get("weight_map", index)
    folder = os.path.dirname(index_path)
    files = [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]
    missing = [name for name in files if not os.path.isfile(name)]
    if missing:
        raise FileNotFoundError(f"The index {index_path} lists shards that do not exist: {missing}.")
    return files


class SafetensorsFile:
    """The header of a ``.safetensors`` file and a way to read single tensors from it."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise ValueError(f"{path} is not a safetensors file (it is shorter than its 8-byte header length).")
            (length,) = struct.unpack("<Q", head)
            size = os.fstat(handle.fileno()).st_size
            if length > size - 8:
                raise ValueError(f"{path} is not a safetensors file (its header length {length} exceeds the file).")
            try:
                header = json.loads(handle.read(length))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ValueError(f"{path} is not a safetensors file (unreadable header).") from None
        self.metadata: Optional[dict] = header.pop("__metadata__", None)
        self.entries: dict = header
        self.data_start = 8 + length
        try:
            end = max((int(entry["data_offsets"][1]) for entry in header.values()), default=0)
        except (TypeError, KeyError, IndexError, ValueError):
            raise ValueError(f"{path} is not a safetensors file (a header entry has no data offsets).") from None
        if self.data_start + end > size:
            raise ValueError(f"{path} is truncated: its header describes {self.data_start + end} bytes, the file "
                             f"has {size}.")

    def keys(self) -> list[str]:
        return list(self.entries)

    def check_format(self) -> None:
        """Refuse TensorFlow / Flax exports; a missing ``format`` is read as PyTorch."""
        fmt = (self.metadata or {}).get("format", "pt")
        if fmt not in ("pt", "tf", "flax", "mlx"):
            raise OSError(f"{self.path} has metadata format {fmt!r}; expected a PyTorch ('pt') safetensors file.")
        if fmt != "pt":
            raise ValueError(f"{self.path} was saved by {fmt}; hasten loads PyTorch ('pt') safetensors files only.")

    def dtype_of(self, name: str) -> Optional[torch.dtype]:
        """The torch dtype stored for ``name`` (None for a dtype this reader does not know)."""
        known = _SAFETENSORS_DTYPES.get(self.entries[name]["dtype"])
        return getattr(torch, known, None) if known else None

    def tensors(self, names: Optional[Iterable[str]] = None,
                mapped: Optional[Callable[[str], bool]] = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, CPU tensor)`` for ``names`` (default: all) in file order, as views of the file.

        ``mapped(name)`` says which views the caller keeps (default: all of them). The others are passed on:
        the caller copies them before asking for the next tensor, and the pages they occupy are then released
        (the view stays valid: touching it again reads the file again).
        """
        wanted = self.keys() if names is None else [n for n in names if n in self.entries]
        wanted.sort(key=lambda n: self.entries[n]["data_offsets"][0])
        from safetensors import safe_open

        with safe_open(self.path, framework="pt", device="cpu") as fallback, open(self.path, "rb") as handle:
            whole = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
            if hasattr(os, "posix_fadvise"):  # a page fault reads ahead in large steps
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            asked = ahead = 0  # tensors whose pages were asked for, and their bytes not yet handed out
            for index, name in enumerate(wanted):
                while asked < len(wanted) and (asked <= index or ahead < _READ_AHEAD):
                    self._advise(whole, wanted[asked], "MADV_WILLNEED")
                    ahead += self._size(wanted[asked])
                    asked += 1
                ahead -= self._size(name)
                view = self._view(whole, name)
                yield name, (fallback.get_tensor(name) if view is None else view)
                if view is not None and view.numel() and mapped is not None and not mapped(name):
                    self._advise(whole, name, "MADV_DONTNEED")

    def _size(self, name: str) -> int:
        start, end = self.entries[name]["data_offsets"]
        return end - start

    def _view(self, whole: mmap.mmap, name: str) -> Optional[torch.Tensor]:
        """``name`` as a view of the mapped file; None where safetensors' reader must convert it."""
        dtype = self.dtype_of(name)
        info = self.entries[name]
        start, end = info["data_offsets"]
        if dtype is None or sys.byteorder != "little":
            return None
        shape = tuple(info["shape"])
        itemsize, count = dtype.itemsize, math.prod(shape)
        if count * itemsize != end - start:
            raise ValueError(f"{self.path}: tensor {name!r} has {end - start} bytes for shape {list(shape)} of "
                             f"{dtype}.")
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        if (self.data_start + start) % itemsize:
            return None
        return torch.frombuffer(whole, dtype=dtype, count=count, offset=self.data_start + start).view(shape)

    def _advise(self, whole: mmap.mmap, name: str, advice: str) -> None:
        """``madvise`` the pages of ``name``'s bytes: ``MADV_WILLNEED`` (start reading them from disk now, in the
        background) or ``MADV_DONTNEED`` (give the whole pages back; they stay in the page cache, out of this
        process). A no-op where the platform has no such advice."""
        flag = getattr(mmap, advice, None)
        if flag is None:
            return
        start, end = (self.data_start + offset for offset in self.entries[name]["data_offsets"])
        if advice == "MADV_DONTNEED":  # only pages wholly inside this tensor
            first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
        else:
            first, last = start // mmap.PAGESIZE * mmap.PAGESIZE, end
        if last > first:
            whole.madvise(flag, first, last - first)


class TorchFile:
    """A ``torch.save`` state dict (``.bin`` / ``.pt``), loaded memory-mapped and with ``weights_only=True``."""

    def __init__(self, path: str):
        self.path = path
        self._state: Optional[dict] = None

    def _load(self) -> dict:
        if self._state is None:
            try:
                self._state = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # legacy (non-zip) format cannot be mapped
                self._state = torch.load(self.path, map_location="cpu", weights_only=True)
            if not isinstance(self._state, dict):
                raise ValueError(f"{self.path} does not hold a state dict (found {type(self._state).__name__}).")
        return self._state

    def keys(self) -> list[str]:
        return list(self._load())

    def dtype_of(self, name: str) -> Optional[torch.dtype]:
        value = self._load().get(name)
        return value.dtype if isinstance(value, torch.Tensor) else None

    def tensors(self, names: Optional[Iterable[str]] = None,
                mapped: Optional[Callable[[str], bool]] = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, CPU tensor)``; tensors are views of the memory-mapped file (``mapped`` is accepted for
        symmetry with safetensors files)."""
        state = self._load()
        for name in (list(state) if names is None else [n for n in names if n in state]):
            if isinstance(state[name], torch.Tensor):
                yield name, state[name]

    def close(self) -> None:
        self._state = None


def open_checkpoint(path: str) -> Union[SafetensorsFile, TorchFile]:
    """A reader with ``keys()`` and ``tensors(names)`` for one checkpoint file."""
    return SafetensorsFile(path) if path.endswith(".safetensors") else TorchFile(path)
