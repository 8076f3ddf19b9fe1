"""Finding the files of a checkpoint and reading tensors out of them one at a time.

Two ways to get a tensor out of a safetensors file, chosen per tensor by the loader:

* mapped: a zero-copy view of the file's pages (safetensors' own memory map, copy-on-write), for tensors that
  stay on the CPU in their file dtype. Nothing is read until the weights are used, and they never cost more
  RAM than the file.
* read: plain file reads straight into a freshly allocated tensor, for tensors that are converted, offloaded
  to disk or sent to another device. Only that tensor is in memory, and no mapping of the whole file stays
  resident meanwhile (mapping the file and copying out of it holds up to twice the file in RSS).
"""
from __future__ import annotations

import json
import logging
import os
import struct
import sys
from typing import Callable, Iterable, Iterator, Optional, Union

import torch

from .module_tensors import tensor_bytes_view

logger = logging.getLogger(__name__)

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
        """``(name, CPU tensor)`` for ``names`` (default: all) in file order; ``mapped(name)`` says which ones
        to give as zero-copy views of the file (default: all of them)."""
        wanted = self.keys() if names is None else [n for n in names if n in self.entries]
        wanted.sort(key=lambda n: self.entries[n]["data_offsets"][0])
        from safetensors import safe_open

        readable = sys.byteorder == "little"
        with safe_open(self.path, framework="pt", device="cpu") as mapping, open(self.path, "rb", buffering=0) as handle:
            for name in wanted:
                if mapped is None or mapped(name) or not readable or self.dtype_of(name) is None:
                    yield name, mapping.get_tensor(name)
                else:
                    yield name, self._read(handle, name)

    def _read(self, handle, name: str) -> torch.Tensor:
        info = self.entries[name]
        start, end = info["data_offsets"]
        tensor = torch.empty(tuple(info["shape"]), dtype=getattr(torch, _SAFETENSORS_DTYPES[info["dtype"]]))
        view = tensor_bytes_view(tensor) if tensor.numel() else memoryview(b"")
        if len(view) != end - start:
            raise ValueError(f"{self.path}: tensor {name!r} has {end - start} bytes for shape {info['shape']}.")
        handle.seek(self.data_start + start)
        done = 0
        while done < len(view):
            count = handle.readinto(view[done:])
            if not count:
                raise OSError(f"{self.path} ends inside tensor {name!r}: the file is truncated.")
            done += count
        return tensor


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
