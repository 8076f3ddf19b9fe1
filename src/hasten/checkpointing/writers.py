"""Writing one checkpoint file: pickles with ``torch.save``, tensors as safetensors, each on disk when written.

Flushing (``fsync``) is what makes a completed checkpoint survive a crash of the machine, and what plain
``torch.save`` skips. Waiting for a whole file to reach the disk after writing it costs about as much again
as writing it; ``DurableFile`` instead asks the disk for what is already written while the rest is still
being produced (a background ``fdatasync`` every 64 MB), so at the end only the last part remains.

``torch.save`` normally computes a CRC32 of every tensor for the zip directory. ``torch.load`` never checks
it (a damaged tensor loads silently either way), and computing it takes longer than writing the data, so
checkpoint pickles are written without it; files stay ordinary ``torch.load``-able zip archives.

Inside a checkpoint's staging folder (``atomic.py``) a plain write is enough: the folder becomes visible
only once complete. ``atomic_file`` is for files written into a folder that is already in use
(``save_model``'s shards): a temporary name first, then one rename over the target.

Safetensors files are written straight from tensor memory (``write_safetensors``, ``safetensors_pieces``): the
header, then each tensor's bytes, with no serialised copy of the whole file in between.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import struct
import sys
import threading
from typing import IO, Any, Iterator, Mapping, Optional, Union

import torch

from .checksums import RunningChecksum, checksums_enabled, note_computed
from .errors import CheckpointWriteError
from .serialization import atomic_file  # the one implementation, shared with hasten.utils.save

__all__ = ["DurableFile", "write_pickle", "write_tensors", "atomic_file", "write_safetensors", "safetensors_pieces",
           "SAFETENSORS_DTYPES", "without_zip_checksums"]

_SYNC_EVERY = 64 << 20  # bytes written between two background flushes (64 MB: measured best here, issue 40)


class DurableFile:
    """A binary file for writing that is flushed to disk as it grows; ``close()`` returns once all of it is."""

    def __init__(self, path: Union[str, os.PathLike], sync_every: int = _SYNC_EVERY, checksum: bool = False):
        self._path = path
        # its checksum, computed from the bytes as they are written (see checksums.py)
        self._checksum = RunningChecksum() if checksum and checksums_enabled() else None
        self._file = open(path, "wb", buffering=0)
        self._sync_every = sync_every
        self._unsynced = 0
        self._syncing: Optional[threading.Thread] = None
        self._sync_error: Optional[BaseException] = None
        self.error: Optional[OSError] = None  # the first write error (torch.save hides it behind its own)

    def _put(self, view) -> int:
        return self._file.write(view)

    def write(self, data: Union[bytes, bytearray, memoryview]) -> int:
        view = memoryview(data).cast("B")
        written = 0
        try:
            while written < len(view):  # an unbuffered write may take less than it was given
                written += self._put(view[written:])
        except OSError as error:
            self.error = self.error or error
            raise
        if self._checksum is not None:
            self._checksum.update(view)
        self._unsynced += written
        if self._unsynced >= self._sync_every and (self._syncing is None or not self._syncing.is_alive()):
            self._unsynced = 0
            self._syncing = threading.Thread(target=self._sync, name="hasten-fsync", daemon=True)
            self._syncing.start()
        return written

    def _sync(self) -> None:
        try:
            os.fdatasync(self._file.fileno()) if hasattr(os, "fdatasync") else os.fsync(self._file.fileno())
        except BaseException as error:  # noqa: BLE001 - reported by close()
            self._sync_error = error

    def flush(self) -> None:
        """Nothing is buffered here; durability comes with ``close()``."""

    def close(self) -> None:
        try:
            if self._syncing is not None:
                self._syncing.join()
            if self._sync_error is not None:
                raise self._sync_error
            os.fsync(self._file.fileno())
        finally:
            self._file.close()
        if self._checksum is not None:
            note_computed(self._path, self._checksum)

    def __enter__(self) -> "DurableFile":
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:
            self.close()
        else:
            if self._syncing is not None:
                self._syncing.join()
            self._file.close()


@contextlib.contextmanager
def without_zip_checksums():
    """``torch.save`` without CRC32 computation (see the module docstring); a no-op where torch lacks the knob."""
    config = getattr(getattr(getattr(torch.utils, "serialization", None), "config", None), "save", None)
    if config is None or not hasattr(config, "compute_crc32"):
        yield
        return
    previous = config.compute_crc32
    config.compute_crc32 = False
    try:
        yield
    finally:
        config.compute_crc32 = previous


def write_failed(path: Union[str, os.PathLike], error: OSError) -> CheckpointWriteError:
    """The error for a file that could not be written: which file, why, and what to do."""
    path = os.fspath(path)
    code = getattr(error, "errno", None) or 0
    if code in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = f" ({shutil.disk_usage(os.path.dirname(path) or '.').free / 2**20:.0f} MiB free there now)"
        except OSError:
            free = ""
        reason = ("the disk is full" if code == errno.ENOSPC else "the disk quota is exceeded") + free
        advice = ("Free space or save to another disk. A save needs room for a whole new checkpoint next to the "
                  "existing ones: with total_limit=N that is N+1 checkpoints, since the oldest is deleted only once "
                  "the new one is complete.")
    else:
        reason = f"{type(error).__name__}: {error}"
        advice = "Check the disk and the folder's permissions, then save again."
    return CheckpointWriteError(f"Could not write {os.path.basename(path)} in {os.path.dirname(path)}: {reason}. "
                                f"The save was abandoned; the previous checkpoint is untouched. {advice}", code)


def write_pickle(obj: Any, path: Union[str, os.PathLike], checksum: bool = False) -> None:
    """``torch.save(obj, path)``, on disk when it returns (``checksum``: see ``DurableFile``)."""
    handle = None
    try:
        with DurableFile(path, checksum=checksum) as handle, without_zip_checksums():
            torch.save(obj, handle)
    except (OSError, RuntimeError) as error:
        cause = handle.error if handle is not None and handle.error is not None else error
        if isinstance(cause, OSError):
            raise write_failed(path, cause) from error
        raise


def write_tensors(tensors: dict, path: Union[str, os.PathLike], metadata: Optional[dict] = None,
                  checksum: bool = False) -> None:
    """A ``.safetensors`` file of ``tensors`` (no aliases: drop them first), on disk when it returns."""
    pieces = safetensors_pieces(tensors, metadata)
    try:
        with DurableFile(path, checksum=checksum) as handle:
            for piece in pieces:
                handle.write(piece)
    except OSError as error:
        raise write_failed(path, error) from error


SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.complex64: "C64",
}
_HEADER_ALIGNMENT = 8


def _host_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's data as a flat CPU uint8 tensor (no copy for contiguous CPU tensors)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    tensor = tensor.contiguous()
    return tensor.reshape(-1).view(torch.uint8)


def _check(tensors: Mapping) -> None:
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"safetensors files need string keys, got {name!r}.")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"safetensors files hold tensors only; {name!r} is a {type(tensor).__name__}.")
        if tensor.layout != torch.strided:
            raise TypeError(f"safetensors cannot store the sparse tensor {name!r}; call .to_dense() first.")
        if tensor.device.type == "meta":
            raise ValueError(f"{name!r} is on the meta device (it has no data): load or materialise it first.")
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"safetensors cannot store {name!r} of dtype {tensor.dtype}.")


def safetensors_pieces(tensors: Mapping[str, torch.Tensor],
                       metadata: Optional[dict] = None) -> Iterator[Union[bytes, memoryview]]:
    """The bytes of a safetensors file of ``tensors``, in order: the header, then each tensor's own memory.
    Bad input (a non-tensor, a sparse or meta tensor) raises here, before anything is produced."""
    _check(tensors)
    return _pieces(tensors, metadata)


def _pieces(tensors: Mapping[str, torch.Tensor], metadata: Optional[dict]) -> Iterator:
    if sys.byteorder != "little":  # the format is little-endian; let the library convert
        from safetensors.torch import save

        yield save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata=metadata)
        return
    # Larger elements first, as the reference writer does, so that every tensor starts at an aligned offset.
    order = sorted(tensors, key=lambda name: -tensors[name].element_size())
    header: dict = {"__metadata__": {str(k): str(v) for k, v in (metadata or {"format": "pt"}).items()}}
    offset = 0
    for name in order:
        tensor = tensors[name]
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % _HEADER_ALIGNMENT)
    yield struct.pack("<Q", len(encoded)) + encoded
    for name in order:
        if tensors[name].numel():
            yield _host_bytes(tensors[name]).numpy().data


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: Union[str, os.PathLike, IO[bytes]],
                      metadata: Optional[dict] = None) -> None:
    """Write ``tensors`` to ``path`` (a path or a binary file object) in the safetensors format. Tensors that
    share memory are written twice: drop aliases first if they should be stored once."""
    pieces = safetensors_pieces(tensors, metadata)
    if hasattr(path, "write"):
        for piece in pieces:
            path.write(piece)
        return
    with open(path, "wb") as handle:
        for piece in pieces:
            handle.write(piece)
