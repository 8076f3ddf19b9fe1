"""A process's own files, added to a checkpoint the main process completed by itself (``participation.py``).

Under one process per replica (DDP), the main process writes the complete checkpoint and marks it
``"contributions": true`` with a ``save_id``. Every other process that calls ``save_state`` adds its own files:

1. while the main process writes, it writes its random states and loader positions (and whatever its save hooks
   write) into a staging folder of its own next to the checkpoint, ``.{name}.process_{i}.incomplete`` (locked like
   the main process's, so a second job cannot take it);
2. once the main process has published that the checkpoint is complete (the store), it checks that the folder holds
   that save (the ``save_id``), moves its files in, one rename each, and writes its record last:
   ``hasten_process_{i}.json``, with the save's id and every file's size and checksum.

A file counts only with its record and only for that save. A process announces itself (the store) before it stages
anything, and the main process lists the processes announced when it completes the checkpoint
(``"expected_processes"``): ``load_state`` refuses such a checkpoint as incomplete when one of them has no record (it
was killed half way), so resuming falls back to the previous checkpoint as after any interrupted save. ``load_state``
on process ``i`` reads its own files when its record matches (a changed byte is refused, as everywhere); a process that
never called ``save_state`` (it was called on the main process only) warns once that its random generators keep
their state and takes the main process's loader positions, as the reference library does when a process's random
states are missing.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from . import layout
from .atomic import SaveLock, content_changed, files_of, fsync_folder, read_marker
from .checksums import check_file, checksums_enabled, checksums_of
from .errors import CheckpointError, CorruptCheckpointError, IncompleteCheckpointError

if TYPE_CHECKING:
    from .participation import Handshake
    from .strategy_protocol import CheckpointingStrategy
    from .targets import CheckpointTargets

__all__ = ["ProcessFiles", "add_process_files", "contribution_staging", "recorded_files", "verify_contribution",
           "missing_processes"]

logger = logging.getLogger(__name__)


def contribution_staging(final: Path, process_index: int) -> Path:
    """The hidden folder process ``process_index`` writes its files to before adding them to ``final``."""
    return final.parent / f".{final.name}.process_{process_index}.incomplete"


class ProcessFiles:
    """One process's contribution to one checkpoint (see the module docstring): ``begin`` claims the staging
    folder, the caller writes into ``staging``, ``add(save_id)`` moves the files in and writes the record."""

    def __init__(self, final: Path, process_index: int):
        self.final = Path(final)
        self.process_index = process_index
        self.staging = contribution_staging(self.final, process_index)
        self.lock = SaveLock(self.final, self.staging)

    def begin(self) -> Path:
        self.lock.acquire()
        return self.staging

    def abandon(self) -> None:
        self.lock.abandon()

    def add(self, save_id: str) -> None:
        """Move the staged files into the completed checkpoint and record them (the record last)."""
        try:
            self._add(save_id)
        except BaseException:
            self.abandon()
            raise
        self.lock.abandon()  # what is left: the lock, and entries the checkpoint already had

    def _add(self, save_id: str) -> None:
        marker = self._marker()
        if marker.get("save_id") != save_id:
            raise CheckpointError(
                f"{self.final} no longer holds the save process {self.process_index} belongs to (another save "
                "replaced it before this process could add its files): its random states are not in it.")
        staged = files_of(self.staging)
        checksums = checksums_of(self.staging, staged) if checksums_enabled() else {}
        moved = {}
        for name, size in staged.items():  # file by file: a folder the main process also wrote gets this one's files
            target = self.final / name
            if target.exists():
                logger.warning("%s already holds %s (the main process's): process %d's copy is not added.",
                               self.final, name, self.process_index)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(self.staging / name, target)
            moved[name] = size
        record = {"save_id": save_id, "process_index": self.process_index, "files": moved,
                  "checksums": {name: checksums[name] for name in moved if name in checksums}}
        path = self.final / layout.process_record_file(self.process_index)
        temporary = path.with_name(f".{path.name}.tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        fsync_folder(self.final)

    def _marker(self) -> dict:
        if not self.final.is_dir():
            raise CheckpointError(
                f"The checkpoint folder {self.final} that the main process wrote is not visible from process "
                f"{self.process_index}: processes on different machines do not share this file system. Save to a "
                "shared file system, or set ProjectConfiguration(save_on_each_node=True).")
        marker = read_marker(self.final)
        if marker is None:
            raise CheckpointError(f"{self.final} has no completion marker: the main process's save did not complete "
                                  f"there, so process {self.process_index} cannot add its files.")
        return marker


def add_process_files(strategy: CheckpointingStrategy, targets: CheckpointTargets, folder: Path, handshake: Handshake,
                      async_save: bool = False) -> None:
    """This process's part of a checkpoint the main process writes by itself: its save hooks, random states and
    loader positions, staged now and added once the main process completed the checkpoint (in the background with
    ``async_save``). ``handshake``: the call's ``participation.Handshake``."""
    from ..state import PartialState
    from . import async_save as background

    files = ProcessFiles(folder, PartialState().process_index)
    handshake.announce(files.process_index)  # from here on the checkpoint needs this process's files
    staging = files.begin()
    try:
        snapshot = strategy.collect_checkpoint(targets)
        targets.run_save_hooks(snapshot.weights, staging, strategy.unwrap)
        snapshot.recapture_rng()  # what the hooks drew counts, as in the main process's save
        strategy.write_checkpoint(staging, snapshot, writes_shared_files=False, process_index=files.process_index)
    except BaseException:
        files.abandon()
        raise

    def finish() -> None:
        try:
            save_id = handshake.outcome()
        except BaseException:
            files.abandon()
            raise
        files.add(save_id)

    writing = background.WriteInBackground(every_process=False) if async_save else background.WriteNow()
    writing.finish_alone(folder, finish)


def _record(folder: Path, marker: Optional[dict], process_index: int) -> Optional[dict]:
    """Process ``process_index``'s record for the save ``marker`` describes; None when it has none (or one left by
    an earlier save into this folder)."""
    if not marker or not marker.get("contributions"):
        return None
    path = Path(folder) / layout.process_record_file(process_index)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise CorruptCheckpointError(f"{path} is not valid JSON ({error}): it was modified after it was saved.") \
            from None
    return record if isinstance(record, dict) and record.get("save_id") == marker.get("save_id") else None


def recorded_files(folder: Path, marker: Optional[dict], process_index: int) -> dict:
    """``{name: size}`` of the files process ``process_index`` added to this save (empty: none)."""
    record = _record(folder, marker, process_index)
    return dict(record.get("files") or {}) if record else {}


def verify_contribution(folder: Path, marker: Optional[dict], process_index: int) -> None:
    """Before loading on process ``process_index``: its added files exist with their recorded sizes and checksums
    (``CorruptCheckpointError`` otherwise), and a process the main process expected did add them
    (``IncompleteCheckpointError``: it was killed during the save). Nothing to check for other checkpoints."""
    if not marker or not marker.get("contributions"):
        return
    record = _record(folder, marker, process_index)
    if record is None:
        if process_index in (marker.get("expected_processes") or ()):
            raise IncompleteCheckpointError(
                f"Checkpoint {folder} is incomplete: process {process_index} was adding its files to it and stopped "
                "before it had (it was killed during the save). Load the previous checkpoint.")
        return
    for name, size in (record.get("files") or {}).items():
        found = Path(folder) / name
        if not found.is_file() or found.stat().st_size != size:
            raise CorruptCheckpointError(
                f"Checkpoint {folder} is damaged: process {process_index}'s {name} is missing or changed size since "
                "it was saved. Load another checkpoint.")
        recorded = (record.get("checksums") or {}).get(name)
        if isinstance(recorded, str) and checksums_enabled():
            now = check_file(found, recorded)
            if now is not None:
                raise content_changed(Path(folder), name, now, recorded)


def missing_processes(folder: Path) -> list[int]:
    """The processes that announced their files for the checkpoint in ``folder`` and never recorded them (killed
    during the save): such a checkpoint is incomplete. A quick test (records only; loading checks the files)."""
    try:
        marker = read_marker(Path(folder))
    except CorruptCheckpointError:
        return []
    if not marker or not marker.get("contributions"):
        return []
    missing = []
    for index in marker.get("expected_processes") or ():
        try:
            found = _record(folder, marker, index)
        except CorruptCheckpointError:
            found = None
        if found is None:
            missing.append(index)
    return missing
