"""Several DCP folders written and read by one ``torch.distributed.checkpoint`` call each way.

A sharded checkpoint holds one DCP folder per model and per optimizer (``pytorch_model_fsdp_0/``, ``optimizer_0/``:
the reference library's layout, ``sharded_files.py``), each with its own ``.metadata`` so that each loads alone.
Saving them with one ``dcp.save`` per folder pays DCP's planning collectives (gather the local plans, scatter the
global one, gather the write results) once per folder; here they are paid once per checkpoint:

- ``FolderSetWriter`` takes ``{folder name: state}``: DCP plans the whole as one state dict whose first key is the
  folder; each rank writes its items into files inside their folder and starts their checksums (each process its
  own files: the marker's writer does not read the others back), and ``finish`` writes one ``.metadata`` per
  folder with the folder's prefix taken off every name and file path — byte for byte what a ``dcp.save`` of that
  folder's state alone describes, so each folder still loads alone (in the reference library, in plain DCP).
- ``FolderSetReader`` reads the folders' ``.metadata`` (through ``SafeFileSystemReader``'s restricted unpickler)
  and presents them to DCP as one checkpoint, the folder's name put back in front of every name and file path,
  so one ``dcp.load`` reads them all, whichever way they were written.

The writer uses DCP's file-writing internals (``_write_data``, ``_split_by_size_and_type``); ``available()`` says
whether this PyTorch has them, and ``sharded_io.py`` saves folder by folder where it does not.
"""
from __future__ import annotations

import dataclasses
import os
import queue
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Optional, Union

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

from .checksums import note_written
from .safe_dcp import SafeFileSystemReader

__all__ = ["FolderSetWriter", "FolderSetReader", "available"]


def available() -> bool:
    """Whether this PyTorch's DCP file writer has the internals ``FolderSetWriter`` builds on."""
    from torch.distributed.checkpoint import filesystem

    return hasattr(FileSystemWriter, "_write_data") and hasattr(filesystem, "_split_by_size_and_type")


def _folder_of(fqn: str) -> str:
    return fqn.split(".", 1)[0]


def _without_folder(fqn: str) -> str:
    return fqn.split(".", 1)[1]


def _index_without_folder(index: MetadataIndex) -> MetadataIndex:
    return dataclasses.replace(index, fqn=_without_folder(index.fqn))


def _storage_in_folder(info: Any, folder: str) -> Any:
    """A file location relative to the folder set's root, made relative to ``folder``."""
    relative = info.relative_path
    prefix = folder + "/"
    return dataclasses.replace(info, relative_path=relative[len(prefix):]) if relative.startswith(prefix) else info


class FolderSetWriter(FileSystemWriter):
    """Writes ``{folder: state}`` under ``root`` as one DCP folder per key (see the module doc). Every file is
    flushed to disk (DCP's ``sync_files``), as a folder-by-folder save does."""

    def __init__(self, root: Union[str, os.PathLike], folders: list[str], **kwargs: Any):
        super().__init__(root, **kwargs)
        self._folders = list(folders)

    def prepare_local_plan(self, plan):
        plan = super().prepare_local_plan(plan)
        for folder in self._folders:
            self.fs.mkdir(self.fs.concat_path(self.path, folder))
        return plan

    def write_data(self, plan, planner) -> Future:
        from torch.distributed.checkpoint.filesystem import _split_by_size_and_type

        by_folder: dict[str, list] = {}
        for item in plan.items:
            by_folder.setdefault(_folder_of(item.index.fqn), []).append(item)
        files: queue.Queue = queue.Queue()
        paths = []
        for folder, items in by_folder.items():  # one file per folder and rank, as one save per folder writes
            buckets = _split_by_size_and_type(1, items) if self.single_file_per_rank else [[item] for item in items]
            for count, bucket in enumerate(buckets):
                name = f"{folder}/{plan.storage_data.prefix}{count}.distcp"
                paths.append(self.fs.concat_path(self.path, name))
                files.put((paths[-1], name, bucket))
        self.thread_count = max(1, min(files.qsize(), 4))  # the folders' files written (and flushed) side by side
        written = self._write_data(planner, files)
        for path in paths:  # each process checksums its own files, in the background (the marker's writer does not)
            note_written(path)
        return written

    def finish(self, metadata: Metadata, results: list) -> None:
        for folder in self._folders:
            prefix = folder + "."
            own = Metadata(
                state_dict_metadata={_without_folder(name): value
                                     for name, value in metadata.state_dict_metadata.items()
                                     if name.startswith(prefix)},
                planner_data=({_without_folder(name): tuple(path[1:]) for name, path in metadata.planner_data.items()
                               if name.startswith(prefix)} if isinstance(metadata.planner_data, dict)
                              else metadata.planner_data),
            )
            own_results = [[dataclasses.replace(result, index=_index_without_folder(result.index),
                                                storage_data=_storage_in_folder(result.storage_data, folder))
                            for result in rank_results if _folder_of(result.index.fqn) == folder]
                           for rank_results in results]
            writer = FileSystemWriter(self.fs.concat_path(self.path, folder), sync_files=self.sync_files)
            writer.save_id = self.save_id
            writer.set_up_storage_writer(True)
            writer.finish(own, own_results)


class FolderSetReader(SafeFileSystemReader):
    """Reads the DCP folders ``folders`` under ``root`` as one checkpoint whose names start with the folder's
    (see the module doc); each folder's ``.metadata`` may only hold DCP metadata, as for ``SafeFileSystemReader``."""

    def __init__(self, root: Union[str, os.PathLike], folders: list[str], **kwargs: Any):
        super().__init__(root, **kwargs)
        self._folders = list(folders)
        self._merged: Optional[Metadata] = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The folders' metadata as one; read from the files once per reader (a load asks again for it)."""
        from torch.distributed.checkpoint.metadata import StorageMeta

        if self._merged is not None:
            self._merged.storage_meta.load_id = self.load_id
            return self._merged
        merged = Metadata(state_dict_metadata={}, planner_data={}, storage_data={})
        for folder in self._folders:
            own = SafeFileSystemReader(Path(self.path) / folder, unsafe_hint=self._unsafe_hint).read_metadata()
            merged.state_dict_metadata.update({f"{folder}.{name}": value
                                               for name, value in own.state_dict_metadata.items()})
            if isinstance(own.planner_data, dict):
                merged.planner_data.update({f"{folder}.{name}": (folder, *path)
                                            for name, path in own.planner_data.items()})
            merged.storage_data.update({
                dataclasses.replace(index, fqn=f"{folder}.{index.fqn}"):
                    dataclasses.replace(info, relative_path=f"{folder}/{info.relative_path}")
                for index, info in (own.storage_data or {}).items()})
            merged.version = own.version
        merged.storage_meta = StorageMeta()
        merged.storage_meta.load_id = self.load_id
        self._merged = merged
        return merged
