"""The errors checkpointing raises: each says which folder or file is at fault and what to do about it."""
from __future__ import annotations

__all__ = ["CheckpointError", "CheckpointNotFoundError", "IncompleteCheckpointError", "CorruptCheckpointError",
           "UnsafeCheckpointError", "CheckpointWriteError"]


class CheckpointError(RuntimeError):
    """Base class of the checkpointing errors."""


class CheckpointNotFoundError(CheckpointError, ValueError):
    """There is no checkpoint where one was asked for (a ``ValueError`` too, as in the reference library)."""


class IncompleteCheckpointError(CheckpointError):
    """A checkpoint folder lacks a file its save wrote (or never finished): loading it would restore half a run."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file exists but cannot be read (truncated, overwritten, not the expected format)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file needs arbitrary Python objects to be unpickled, which could run code: refused by default."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint file failed (a full disk, a quota, an I/O error); ``errno`` is the system's code.
    The save is abandoned and the previous checkpoint is untouched."""

    def __init__(self, message: str, errno: int = 0):
        super().__init__(message)
        self.errno = errno
