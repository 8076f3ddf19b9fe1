"""Writing one checkpoint file: pickles with ``torch.save``, tensors as safetensors, each on disk when written.

Flushing (``fsync``) is what makes a completed checkpoint survive a crash of the machine, and what plain
``torch.save`` skips. Waiting for a whole file to reach the disk after writing it costs about as much again
as writing it; ``DurableFile`` instead asks the disk for what is already written while the rest is still
being produced (a background ``fdatasync`` every few hundred MB), so at the end only the last part remains.

``torch.save`` normally computes a CRC32 of every tensor for the zip directory. ``torch.load`` never checks
it (a damaged tensor loads silently either way), and computing it takes longer than writing the data, so
checkpoint pickles are written without it; files stay ordinary ``torch.load``-able zip archives.

Inside a checkpoint's staging folder (``atomic.py``) a plain write is enough: the folder becomes visible
only once complete. ``atomic_file`` is for files written into a folder that is already in use
(``save_model``'s shards): a temporary name first, then one rename over the target.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Optional

import torch

from .safetensors_io import safetensors_pieces
from ..utils.serialization import atomic_file  # the one implementation, shared with hasten.utils.save

__all__ = ["DurableFile", "write_pickle", "write_tensors", "atomic_file"]

_SYNC_EVERY = 256 << 20  # bytes written between two background flushes


class DurableFile:
    """A binary file for writing that is flushed to disk as it grows; ``close()`` returns once all of it is."""

    def __init__(self, path, sync_every: int = _SYNC_EVERY):
        self._file = open(path, "wb", buffering=0)
        self._sync_every = sync_every
        self._unsynced = 0
        self._syncing: Optional[threading.Thread] = None
        self._sync_error: Optional[BaseException] = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        written = 0
        while written < len(view):  # an unbuffered write may take less than it was given
            written += self._file.write(view[written:])
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
def _without_zip_checksums():
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


def write_pickle(obj, path) -> None:
    """``torch.save(obj, path)``, on disk when it returns."""
    with DurableFile(path) as handle, _without_zip_checksums():
        torch.save(obj, handle)


def write_tensors(tensors: dict, path, metadata=None) -> None:
    """A ``.safetensors`` file of ``tensors`` (no aliases: drop them first), on disk when it returns."""
    pieces = safetensors_pieces(tensors, metadata)
    with DurableFile(path) as handle:
        for piece in pieces:
            handle.write(piece)


