"""Reading a ``torch.distributed.checkpoint`` (DCP) folder without running code from it.

DCP's own reader unpickles the ``.metadata`` file with plain ``pickle`` and its load planner reads non-tensor
entries with ``torch.load(weights_only=False)``: a checkpoint folder from elsewhere could run any code. Here
``.metadata`` may only name DCP's metadata classes, torch sizes, dtypes and layouts and paths; non-tensor
entries load with ``weights_only=True``. Anything else is refused with an error naming the way to trust it.
"""
from __future__ import annotations

import io
import os
import pickle
import re

from typing import TYPE_CHECKING, Any, Union

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["SafeFileSystemReader", "SafeEmptyStateDictLoadPlanner", "SafeLoadPlanner", "UnsafeCheckpointError",
           "read_dcp_checkpoint"]

_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_NAMED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    ("builtins", "set"), ("builtins", "frozenset"),
    ("pathlib", "Path"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
}


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A DCP checkpoint names Python objects beyond plain metadata; loading it could run code."""


def _refuse(what: str, hint: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{what}; hasten does not unpickle arbitrary objects from a checkpoint (that can run code). If you trust "
        f"this checkpoint, pass {hint}."
    )


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, handle, path: str, hint: str):
        super().__init__(handle)
        self._path, self._hint = path, hint

    def find_class(self, module, name):
        if (module, name) in _NAMED:
            return super().find_class(module, name)
        if module in _METADATA_MODULES:
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        if module == "torch":
            found = getattr(torch, name, None)
            if isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
                return found
        raise _refuse(f"{self._path} names {module}.{name}, which is not DCP metadata", self._hint)


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` may only hold DCP metadata (see the module docstring)."""

    def __init__(self, path: Union[str, os.PathLike], *args: Any, unsafe_hint: str = "weights_only=False",
                 **kwargs: Any):
        super().__init__(path, *args, **kwargs)
        self._unsafe_hint = unsafe_hint

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        path = os.path.join(os.fspath(self.path), ".metadata" if rank is None else f"__{rank}.metadata")
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle, path, self._unsafe_hint).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _PlainValuesOnly:
    """A DCP load planner's ``load_bytes`` that reads non-tensor entries with ``weights_only=True`` (mixed into
    torch's planners below)."""

    def __init__(self, *args, unsafe_hint: str = "weights_only=False", **kwargs):
        super().__init__(*args, **kwargs)
        self._unsafe_hint = unsafe_hint

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as error:
            named = re.search(r"GLOBAL ([\w.]+)", str(error))
            what = f"an object of {named.group(1)}" if named else "Python objects beyond plain values"
            raise _refuse(f"Checkpoint entry {read_item.dest_index.fqn!r} holds {what}", self._unsafe_hint) from None
        if self.flatten_state_dict:  # what torch's planner does with the value, without its torch.load
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class _CountedReads:
    """A DCP load planner that advances a progress bar for each piece it reads (consolidating a big sharded
    checkpoint into one process takes a while; see ``utils.progress`` for when the bar shows)."""

    _bar = None

    def create_local_plan(self):
        from ..progress import progress_bar

        plan = super().create_local_plan()
        self._bar = progress_bar(total=len(plan.items), desc="Reading checkpoint shards", unit="piece")
        return plan

    def _advance(self) -> None:
        if self._bar is not None and hasattr(self._bar, "update"):
            self._bar.update(1)
            if self._bar.n >= self._bar.total:
                self._bar.close()

    def commit_tensor(self, read_item, tensor) -> None:
        super().commit_tensor(read_item, tensor)
        self._advance()

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        super().load_bytes(read_item, value)
        self._advance()


class SafeEmptyStateDictLoadPlanner(_CountedReads, _PlainValuesOnly, _EmptyStateDictLoadPlanner):
    """The planner that fills an empty state dict, reading non-tensor entries with ``weights_only=True``; a progress
    bar counts the pieces read (merging weights, reading a sharded checkpoint into one process)."""


class SafeLoadPlanner(_PlainValuesOnly, DefaultLoadPlanner):
    """torch's ``DefaultLoadPlanner`` (loading into an existing state dict, resharding to this run's layout) whose
    non-tensor entries load with ``weights_only=True``."""


def read_dcp_checkpoint(checkpoint_dir: Union[str, os.PathLike], *, weights_only: bool = True,
                        unsafe_hint: str = "weights_only=False") -> dict:
    """The whole state dict of the DCP checkpoint in ``checkpoint_dir``, read in this one process (CPU).

    With ``weights_only`` (the default) nothing beyond DCP metadata, tensors and plain values is unpickled; a file
    that needs more raises ``UnsafeCheckpointError`` naming ``unsafe_hint``, the caller's way to trust it.
    """
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state_dict: dict = {}
    if not weights_only:
        _load_state_dict(state_dict, storage_reader=FileSystemReader(str(checkpoint_dir)),
                         planner=_EmptyStateDictLoadPlanner(), no_dist=True)
        return state_dict
    reader = SafeFileSystemReader(str(checkpoint_dir), unsafe_hint=unsafe_hint)
    reader.read_metadata()  # refused here, with its own error, before DCP wraps it in its own exception
    try:
        _load_state_dict(state_dict, storage_reader=reader,
                         planner=SafeEmptyStateDictLoadPlanner(unsafe_hint=unsafe_hint), no_dist=True)
    except CheckpointException as error:
        for failure in error.failures.values():
            cause = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(cause, UnsafeCheckpointError):
                raise cause from None
        raise
    return state_dict
