"""Where the bytes of one tensor stored with ``torch.save`` lie in its archive, found without loading it.

A DCP checkpoint stores each tensor piece as a ``torch.save`` archive (a zip) inside its data files. To read a piece
straight into the tensor it is loaded into (``safe_dcp.py``), only small parts of the archive are needed: the zip's
central directory at its end (read here with ``struct``, a few hundred bytes), which says where each record starts,
and the ``data.pkl`` header, which says the stored
tensor's dtype, shape, strides and storage. The header is read by an unpickler that knows three names
(``torch._utils._rebuild_tensor_v2``, ``collections.OrderedDict`` and torch's storage type names) and builds nothing
from them: it records the arguments. Any other archive (several storages, a view into a bigger storage, another
byte order, a compressed record) is answered with None, and the caller reads it the usual way.
"""
from __future__ import annotations

import collections
import io
import pickle
import struct
from dataclasses import dataclass
from typing import IO, Any, Optional

import torch

__all__ = ["StoredTensor", "stored_tensor"]

_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # a zip entry's local header (30 bytes)
_LOCAL_SIGNATURE = 0x04034B50


@dataclass(frozen=True)
class StoredTensor:
    """A stored tensor's layout and where its bytes start in the archive (``data_offset``, from its start)."""

    dtype: torch.dtype
    shape: tuple
    stride: tuple
    data_offset: int
    nbytes: int

    @property
    def contiguous(self) -> bool:
        """Whether the bytes are in row-major order (the order a contiguous tensor of ``shape`` has)."""
        expected, step = [], 1
        for size in reversed(self.shape):
            expected.append(step)
            step *= max(size, 1)
        return all(size == 1 or mine == wanted
                   for size, mine, wanted in zip(self.shape, self.stride, reversed(expected)))


class _Rebuilt:
    """What the header's ``_rebuild_tensor_v2(storage, offset, size, stride, ...)`` call was given."""

    def __init__(self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)
        self.plain = not hooks and metadata is None


class _StorageName(str):
    """A storage type's name from the header (``"FloatStorage"``); never called."""


class _HeaderUnpickler(pickle.Unpickler):
    """Reads a tensor archive's ``data.pkl`` knowing only the names a plain tensor needs; builds no torch object."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _Rebuilt
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return _StorageName(name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a plain tensor's header")

    def persistent_load(self, pid: Any) -> Any:
        return tuple(pid) if isinstance(pid, tuple) else None


def _dtype_of(storage_name: str) -> Optional[torch.dtype]:
    names = {name: dtype for dtype, name in torch.storage._dtype_to_storage_type_map().items()}
    return names.get(storage_name)


_END = struct.Struct("<IHHHHIIH")  # the end of the central directory (22 bytes; torch writes no comment)
_END_SIGNATURE = 0x06054B50
_ENTRY = struct.Struct("<IHHHHHHIIIHHHHHII")  # a central directory entry (46 bytes, then name, extra, comment)
_ENTRY_SIGNATURE = 0x02014B50


def _read_at(stream: IO[bytes], position: int, size: int) -> bytes:
    stream.seek(position)
    data = stream.read(size)
    if len(data) != size:
        raise EOFError("the archive ends early")
    return data


def _entries(stream: IO[bytes], offset: int, length: int) -> dict[str, tuple[int, int, int]]:
    """``{name: (compression method, size, local header offset)}`` from the archive's central directory."""
    if length < _END.size:
        raise EOFError("too short for an archive")
    end = _END.unpack(_read_at(stream, offset + length - _END.size, _END.size))
    if end[0] != _END_SIGNATURE or end[5] + end[6] > length:
        raise ValueError("no plain zip directory at the end")
    directory = _read_at(stream, offset + end[6], end[5])
    entries, position = {}, 0
    for _ in range(end[4]):
        fields = _ENTRY.unpack_from(directory, position)
        if fields[0] != _ENTRY_SIGNATURE:
            raise ValueError("a damaged zip directory")
        start = position + _ENTRY.size
        name = directory[start:start + fields[10]].decode("utf-8", "replace")
        entries[name] = (fields[4], fields[9], fields[16])
        position = start + fields[10] + fields[11] + fields[12]
    return entries


def _data_start(stream: IO[bytes], offset: int, local_header: int) -> int:
    """Where an entry's bytes start in the archive: after its local header, whose extra field may differ from the
    directory's."""
    fields = _LOCAL_HEADER.unpack(_read_at(stream, offset + local_header, _LOCAL_HEADER.size))
    if fields[0] != _LOCAL_SIGNATURE:
        raise ValueError("a damaged zip entry")
    return local_header + _LOCAL_HEADER.size + fields[9] + fields[10]


def stored_tensor(stream: IO[bytes], offset: int, length: int) -> Optional[StoredTensor]:
    """The layout of the one tensor stored in the ``torch.save`` archive at ``[offset, offset + length)`` of
    ``stream`` and where its bytes start (from ``offset``); None for anything but a plain tensor on a storage of its
    own, in little-endian order, stored uncompressed (a zip64 archive, over 4 GB, included: the caller's usual way
    reads it)."""
    try:
        entries = _entries(stream, offset, length)
        headers = [name for name in entries if name.endswith("/data.pkl")]
        records = [name for name in entries if name.rsplit("/", 2)[-2:-1] == ["data"]]
        if len(headers) != 1 or len(records) != 1 or any(entries[name][0] != 0 for name in (*headers, *records)):
            return None
        order = [name for name in entries if name.endswith("/byteorder")]
        if order and _read_at(stream, offset + _data_start(stream, offset, entries[order[0]][2]),
                              entries[order[0]][1]) != b"little":
            return None
        header = _read_at(stream, offset + _data_start(stream, offset, entries[headers[0]][2]), entries[headers[0]][1])
        rebuilt = _HeaderUnpickler(io.BytesIO(header)).load()
        _, nbytes, local = entries[records[0]]
        start = _data_start(stream, offset, local)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, struct.error, OSError):
        return None
    if not (isinstance(rebuilt, _Rebuilt) and rebuilt.plain and rebuilt.offset == 0):
        return None
    storage = rebuilt.storage
    if not (isinstance(storage, tuple) and len(storage) == 5 and storage[0] == "storage"
            and isinstance(storage[1], _StorageName) and f"data/{storage[2]}" == records[0].split("/", 1)[-1]):
        return None
    dtype = _dtype_of(storage[1])
    numel = 1
    for size in rebuilt.size:
        numel *= size
    if dtype is None or storage[4] != numel or nbytes != numel * dtype.itemsize or start + nbytes > length:
        return None
    return StoredTensor(dtype=dtype, shape=rebuilt.size, stride=rebuilt.stride, data_offset=start, nbytes=nbytes)
