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
import errno
import os
import shutil
import threading
from typing import Optional

import torch

from .checksums import note_written
from .errors import CheckpointWriteError
from .safetensors_io import safetensors_pieces
from .serialization import atomic_file  # the one implementation, shared with hasten.utils.save

__all__ = ["DurableFile", "write_pickle", "write_tensors", "atomic_file"]

_SYNC_EVERY = 256 << 20  # bytes written between two background flushes


class DurableFile:
    """A binary file for writing that is flushed to disk as it grows; ``close()`` returns once all of it is."""

    def __init__(self, path, sync_every: int = _SYNC_EVERY, checksum: bool = False):
        self._path = path
        self._checksum = checksum  # start its checksum in the background once closed (see checksums.py)
        self._file = open(path, "wb", buffering=0)
        self._sync_every = sync_every
        self._unsynced = 0
        self._syncing: Optional[threading.Thread] = None
        self._sync_error: Optional[BaseException] = None
        self.error: Optional[OSError] = None  # the first write error (torch.save hides it behind its own)

    def _put(self, view) -> int:
        return self._file.write(view)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        written = 0
        try:
            while written < len(view):  # an unbuffered write may take less than it was given
                written += self._put(view[written:])
        except OSError as error:
            self.error = self.error or error
            raise
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
        if self._checksum:
            note_written(self._path)

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


def write_failed(path, error: OSError) -> CheckpointWriteError:
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


def write_pickle(obj, path, checksum: bool = False) -> None:
    """``torch.save(obj, path)``, on disk when it returns (``checksum``: see ``DurableFile``)."""
    handle = None
    try:
        with DurableFile(path, checksum=checksum) as handle, _without_zip_checksums():
            torch.save(obj, handle)
    except (OSError, RuntimeError) as error:
        cause = handle.error if handle is not None and handle.error is not None else error
        if isinstance(cause, OSError):
            raise write_failed(path, cause) from error
        raise


def write_tensors(tensors: dict, path, metadata=None, checksum: bool = False) -> None:
    """A ``.safetensors`` file of ``tensors`` (no aliases: drop them first), on disk when it returns."""
    pieces = safetensors_pieces(tensors, metadata)
    try:
        with DurableFile(path, checksum=checksum) as handle:
            for piece in pieces:
                handle.write(piece)
    except OSError as error:
        raise write_failed(path, error) from error


