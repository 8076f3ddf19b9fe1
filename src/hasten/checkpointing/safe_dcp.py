"""Reading a ``torch.distributed.checkpoint`` (DCP) folder without running code from it.

DCP's own reader unpickles the ``.metadata`` file with plain ``pickle`` and its load planner reads non-tensor
entries with ``torch.load(weights_only=False)``: a checkpoint folder from elsewhere could run any code. Here
``.metadata`` may only name DCP's metadata classes, torch sizes, dtypes and layouts and paths; non-tensor
entries load with ``weights_only=True``. Anything else is refused with an error naming the way to trust it.

It also reads each stored tensor straight into the tensor it is loaded into when the two have the same layout (the
same shape, dtype and contiguous strides: a load at the layout the checkpoint was saved with). DCP's own reader
unpickles every stored tensor into a new buffer and then copies it over, writing every byte twice; here only the
stored tensor's zip directory and small header are read (``stored_tensor.py``, which builds nothing from the
header), and its data record is read into the destination in one ``readinto``. A piece read only in part
(resharding), a transformed (compressed) piece or a big-endian file goes DCP's way.
"""
from __future__ import annotations

import dataclasses
import io
import os
import pickle
import re
import sys

from typing import TYPE_CHECKING, Any, Union

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
from torch.futures import Future

from ..core.gc_pause import gc_paused
from .stored_tensor import stored_tensor

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner

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
    """``FileSystemReader`` whose ``.metadata`` may only hold DCP metadata, and which reads a stored tensor straight
    into a destination of the same layout (see the module docstring)."""

    def __init__(self, path: Union[str, os.PathLike], *args: Any, unsafe_hint: str = "weights_only=False",
                 **kwargs: Any):
        super().__init__(path, *args, **kwargs)
        self._unsafe_hint = unsafe_hint

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        path = os.path.join(os.fspath(self.path), ".metadata" if rank is None else f"__{rank}.metadata")
        with open(path, "rb") as handle, gc_paused():  # core/gc_pause.py
            metadata = _MetadataUnpickler(io.BytesIO(handle.read()), path, self._unsafe_hint).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        """Read the plan's tensors that can go straight into their destination, file by file in file order; the
        rest (values, pieces read in part, transformed pieces) through DCP's reader."""
        from torch.distributed.checkpoint.planner import LoadItemType

        by_file: dict[str, list] = {}
        for item in plan.items:
            if item.type == LoadItemType.TENSOR:
                by_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        done = set()
        for relative_path, items in by_file.items():
            with self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb") as stream:
                for item in sorted(items, key=lambda item: self.storage_data[item.storage_index].offset):
                    if _read_in_place(stream, self.storage_data[item.storage_index], item, planner):
                        done.add(id(item))
        rest = [item for item in plan.items if id(item) not in done]
        if rest:
            return super().read_data(dataclasses.replace(plan, items=rest), planner)
        finished: Future = Future()
        finished.set_result(None)
        return finished


def _read_in_place(stream, stored: Any, item: Any, planner: LoadPlanner) -> bool:
    """Read the stored tensor ``stored`` (a ``torch.save`` archive at ``stored.offset`` in ``stream``) into the
    destination of ``item`` when the item is the whole stored tensor and the destination has its layout; whether it
    was read. Only the archive's directory and header are read (``stored_tensor.py``)."""
    if getattr(stored, "transform_descriptors", None) or sys.byteorder != "little" or any(item.storage_offsets):
        return False
    found = stored_tensor(stream, stored.offset, stored.length)
    if found is None or not found.contiguous or tuple(item.lengths) != found.shape:
        return False
    target = planner.resolve_tensor(item).detach()
    if target.device.type != "cpu" or target.dtype != found.dtype or tuple(target.shape) != found.shape \
            or not target.is_contiguous():
        return False
    stream.seek(stored.offset + found.data_offset)
    if found.nbytes and stream.readinto(target.reshape(-1).view(torch.uint8).numpy()) != found.nbytes:
        raise EOFError(f"{getattr(stream, 'name', 'a checkpoint file')}: the stored tensor {item.storage_index.fqn!r} "
                       "ends before its data does (the file is truncated).")
    planner.commit_tensor(item, target)
    return True


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
