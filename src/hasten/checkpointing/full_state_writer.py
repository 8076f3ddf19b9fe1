"""The default checkpoint writer: full state dicts as the reference library's files.

The process that writes the shared files (``SaveTransaction.writes_shared_files``: the main process, or each
machine's without a shared file system) writes models, optimizers, schedulers, scaler and registered objects;
every process writes its own random states and loader positions. All into the staging folder.
"""
from __future__ import annotations

from pathlib import Path

from . import layout
from .model_files import drop_aliases
from .snapshot import Snapshot
from .writers import write_pickle, write_tensors

__all__ = ["write_full_state", "write_shared_files", "write_process_files"]


def write_full_state(staging: Path, snapshot: Snapshot, *, writes_shared_files: bool, process_index: int,
                     safe_serialization: bool = True) -> None:
    """Write ``snapshot`` into ``staging``: the shared files when this process writes them, its own always."""
    if writes_shared_files:
        write_shared_files(staging, snapshot, safe_serialization)
    write_process_files(staging, snapshot, process_index)


def write_shared_files(folder: Path, snapshot: Snapshot, safe_serialization: bool) -> None:
    for index, weights in enumerate(snapshot.weights):
        if weights is None:
            continue
        path = folder / layout.model_file(index, safe_serialization)
        if safe_serialization:
            write_tensors(drop_aliases(weights)[0], path, metadata={"format": "pt"}, checksum=True)
        else:
            write_pickle(weights, path, checksum=True)
    for index, state in enumerate(snapshot.optimizers):
        write_pickle(state, folder / layout.optimizer_file(index), checksum=True)
    for index, state in enumerate(snapshot.schedulers):
        write_pickle(state, folder / layout.scheduler_file(index), checksum=True)
    if snapshot.scaler is not None:
        write_pickle(snapshot.scaler, folder / layout.SCALER_NAME, checksum=True)
    for index, state in enumerate(snapshot.custom):
        write_pickle(state, folder / layout.custom_object_file(index), checksum=True)


def write_process_files(folder: Path, snapshot: Snapshot, process_index: int) -> None:
    write_pickle(snapshot.rng, folder / layout.rng_file(process_index), checksum=True)
    if snapshot.loaders:
        write_pickle(snapshot.loaders, folder / layout.loader_states_file(process_index), checksum=True)
