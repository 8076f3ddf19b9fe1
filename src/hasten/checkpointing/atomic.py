"""All or nothing on disk: a checkpoint folder either holds a whole saved state or does not exist.

A save writes into a hidden staging folder next to the target (``.{name}.incomplete``). When every file is
written and flushed to disk, a completion marker (``hasten_checkpoint.json``: every file, its size and a
checksum, see ``checksums.py``) is written last, and the staging folder is renamed to the target in one
step. A save killed at any moment therefore leaves either the previous checkpoint or the new one under the
target name, never a mixture; the staging folder it leaves behind is ignored by ``load_state`` and removed by the next save.

Replacing an existing folder (``save_state("ckpt")`` twice) moves the old one aside (``.{name}.replaced``),
renames the new one in and deletes the old. Files in the old folder that are not part of a checkpoint (the
user's own notes, a config written next to it) are carried over into the new one, as the reference library,
which overwrites files in place, would keep them.

One writer per checkpoint folder (``SaveLock``): two jobs saving to the same folder (two runs started with the
same ``project_dir``, a job restarted while its previous copy still runs) would otherwise delete each other's
staging folder half way. The save that starts first creates ``.hasten_lock`` in the staging folder (an exclusive
create: exactly one wins) holding its process id and host name; the other stops with an error naming them. A lock
left by a process that died (same host, that process id no longer running) is taken over, with what that save
left; one from another host is trusted until removed by hand, since whether its process runs cannot be checked
from here. The lock travels with the folder's rename and is deleted right after; it is never listed in the
completion marker.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Callable, Optional, Union

from .checksums import check_files_later, checksums_enabled, checksums_of
from .errors import CheckpointError, CorruptCheckpointError, IncompleteCheckpointError
from . import layout
from .layout import MARKER_NAME
from .serialization import fsync_file  # the one implementation, shared with hasten.utils.save

__all__ = ["staging_folder", "replaced_folder", "fsync_file", "fsync_folder", "write_marker", "read_marker",
           "verify_complete", "start_content_check", "file_shares", "content_changed", "CONTENT_CHANGED", "is_complete",
           "swap_into_place",
           "recover_interrupted_swap", "remove_folder", "files_of", "MARKER_FORMAT", "SaveLock", "LOCK_NAME",
           "lock_holder_alive", "read_lock", "STAGING_SUFFIX", "marker_for", "process_markers"]

MARKER_FORMAT = 1
LOCK_NAME = ".hasten_lock"  # the save in progress (SaveLock, below)
STAGING_SUFFIX = ".incomplete"
_REPLACED_SUFFIX = ".replaced"
_DELETING_SUFFIX = ".deleting"


def staging_folder(final: Path) -> Path:
    """The hidden folder a save into ``final`` writes to first."""
    return final.parent / f".{final.name}{STAGING_SUFFIX}"


def replaced_folder(final: Path) -> Path:
    """Where the previous content of ``final`` waits while a new save takes its place."""
    return final.parent / f".{final.name}{_REPLACED_SUFFIX}"


def is_staging_name(name: str) -> bool:
    return name.startswith(".") and name.endswith((STAGING_SUFFIX, _REPLACED_SUFFIX, _DELETING_SUFFIX))


# ----------------------------------------------------------------------------- flushing
def fsync_folder(path: Union[str, os.PathLike]) -> None:
    """Flush a folder's entries (renames, new files) to the disk; a no-op where folders cannot be opened."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some file systems refuse fsync on folders; the rename is still atomic
    finally:
        os.close(descriptor)


def files_of(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` (relative POSIX path -> size in bytes), the markers and the lock excluded."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            relative = path.relative_to(folder).as_posix()
            if relative != LOCK_NAME and not layout.is_marker(relative):
                found[relative] = path.stat().st_size
    return dict(sorted(found.items()))


# ----------------------------------------------------------------------------- the marker
def write_marker(folder: Path, metadata: dict, known_checksums: Optional[dict] = None,
                 name: str = MARKER_NAME) -> dict:
    """Flush every file of ``folder``, then write the completion marker listing them; returns the marker.
    ``known_checksums``: ``{relative path: checksum}`` the writing processes computed once each file was on disk
    (the others are flushed and checksummed here), so the marker's writer does no work per file of the others.
    ``name``: ``hasten_checkpoint.json``, or a process's own marker (``layout.process_marker_file``) when it saved
    into a folder other than the main process's."""
    files = files_of(folder)
    known_checksums = known_checksums or {}
    for relative in files:
        if relative not in known_checksums:  # those were flushed by the process that wrote them, then reported
            fsync_file(folder / relative)
    marker = {"format": MARKER_FORMAT, "complete": True, "written_at": time.time(), **metadata, "files": files}
    if checksums_enabled():  # the writers' values; any other file read back from the page cache
        marker["checksums"] = checksums_of(folder, files, known_checksums)
    temporary = folder / f".{name}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(marker, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, folder / name)
    fsync_folder(folder)
    return marker


def read_marker(folder: Path, name: str = MARKER_NAME) -> Optional[dict]:
    """The completion marker of ``folder``; None when there is none (a save that never finished, or a
    checkpoint written by another library). ``name``: another marker of the folder (``layout.process_marker_file``)."""
    path = Path(folder) / name
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        marker = json.loads(text)
    except ValueError as error:
        raise CorruptCheckpointError(
            f"The completion marker {path} is not valid JSON ({error}): the checkpoint was modified after it was "
            "saved. Load another checkpoint."
        ) from None
    if not isinstance(marker, dict) or not isinstance(marker.get("files"), dict):
        raise CorruptCheckpointError(f"The completion marker {path} does not list the checkpoint's files.")
    return marker


def is_complete(folder: Union[str, os.PathLike]) -> bool:
    """Whether ``folder`` carries a readable completion marker (a quick test; ``verify_complete`` checks files)."""
    try:
        return read_marker(Path(folder)) is not None
    except CorruptCheckpointError:
        return False


def start_content_check(folder: Path, marker: Optional[dict], share: tuple[int, int] = (0, 1),
                        own_folder: bool = False) -> Callable[[], Optional[tuple[str, str, str]]]:
    """Start recomputing the checksums the marker recorded (in the background); returns ``wait()``, which gives
    None or ``(file, checksum now, checksum saved)`` of a file whose content changed. ``share``: ``(this process,
    processes)`` — each checks its own files (random states, loader positions: a damage is then reported as that
    process's) and its share of the others (``file_shares``), so that a load on many processes reads the checkpoint
    back once, not once per process; the caller makes every process hear of a mismatch. ``own_folder``: the
    processes load different folders (each its own copy), so this one checks every shared file of ``folder``."""
    checksums = marker.get("checksums") if marker else None
    if not isinstance(checksums, dict) or not checksums_enabled():
        return lambda: None
    recorded = {relative: value for relative, value in checksums.items()
                if relative in marker["files"] and isinstance(value, str)}
    process, processes = share
    own = {name: index for index in range(processes) for name in layout.process_files(index)}
    shared = {relative: marker["files"][relative] for relative in recorded if relative not in own}
    dealt = list(shared) if own_folder else file_shares(shared, processes)[process]
    mine = dealt + [relative for relative in recorded if own.get(relative) == process]
    return check_files_later(Path(folder), {relative: recorded[relative] for relative in mine})


def file_shares(sizes: dict[str, int], processes: int) -> list[list[str]]:
    """The files of ``sizes`` (relative path -> bytes) dealt to ``processes`` so that each reads about as many
    bytes: the largest first, each to the process with the fewest bytes so far (ties: the lowest index). The
    same on every process, since it depends on the marker alone."""
    shares: list[list[str]] = [[] for _ in range(max(1, processes))]
    loads = [0] * len(shares)
    for relative in sorted(sizes, key=lambda name: (-int(sizes[name] or 0), name)):
        lightest = loads.index(min(loads))
        shares[lightest].append(relative)
        loads[lightest] += int(sizes[relative] or 0)
    return shares


#: the words every "content changed" error carries (processes recognise each other's by them)
CONTENT_CHANGED = "its content changed after it was saved"


def content_changed(folder: Path, relative: str, found: str, recorded: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"Cannot read {relative} in {folder}: the file is damaged, its content changed after it was saved "
        f"(checksum {found}, {recorded} was saved). Load another checkpoint (the previous one), or set "
        "HASTEN_CHECKPOINT_CHECKSUMS=0 to load it unchecked if you know why it changed."
    )


def process_markers(folder: Path) -> list[str]:
    """The names of the markers processes wrote into folders of their own, found in ``folder`` (copied there)."""
    try:
        return sorted(name for name in os.listdir(folder) if name != MARKER_NAME and layout.is_marker(name))
    except OSError:
        return []


def marker_for(folder: Path, process_index: int) -> Optional[dict]:
    """The marker process ``process_index`` checks ``folder`` against: its own (it saved into a folder of its own,
    since copied here with the others), else the main process's, else the first other process's (a folder one
    process saved into alone)."""
    own = layout.process_marker_file(process_index)
    if (Path(folder) / own).is_file():
        return read_marker(folder, own)
    marker = read_marker(folder)
    if marker is None:
        others = process_markers(folder)
        marker = read_marker(folder, others[0]) if others else None
    return marker


def verify_complete(folder: Union[str, os.PathLike], check_content: bool = True,
                    process_index: Optional[int] = None) -> Optional[dict]:
    """Check that every file the marker lists exists with its saved size and (``check_content``) checksum;
    return the marker. ``process_index``: check the marker that process reads (``marker_for``).

    Returns None for a folder without marker that is not a staging folder (e.g. written by the reference
    library): the caller then checks the files it needs itself. Raises ``IncompleteCheckpointError`` or
    ``CorruptCheckpointError`` naming the first missing or damaged file.
    """
    folder = Path(folder)
    if is_staging_name(folder.name):
        raise IncompleteCheckpointError(
            f"{folder} is the staging folder of a save that never finished ({MARKER_NAME} was never written): "
            "its files may be partial. Load the checkpoint it was meant to replace, or another one."
        )
    marker = read_marker(folder) if process_index is None else marker_for(folder, process_index)
    if marker is None:
        return None
    for relative, size in marker["files"].items():
        path = folder / relative
        if not path.is_file():
            raise IncompleteCheckpointError(
                f"Checkpoint {folder} is incomplete: {relative} is missing (it was saved, then removed). "
                "Load another checkpoint."
            )
        actual = path.stat().st_size
        if actual != size:
            raise CorruptCheckpointError(
                f"Checkpoint {folder} is damaged: {relative} has {actual} bytes, {size} were saved. "
                "Load another checkpoint."
            )
    if check_content:
        mismatch = start_content_check(folder, marker)()
        if mismatch is not None:
            raise content_changed(folder, *mismatch)
    return marker


# ----------------------------------------------------------------------------- putting a save in place
def remove_folder(folder: Path) -> None:
    """Delete a folder so that no half-deleted copy keeps its name: rename it aside first, then delete."""
    if not folder.exists():
        return
    doomed = folder.parent / f".{folder.name}{_DELETING_SUFFIX}"
    if doomed.exists():
        shutil.rmtree(doomed, ignore_errors=True)
    os.rename(folder, doomed)
    fsync_folder(folder.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def _carried_over(old: Path, new_entries: set, is_checkpoint_file) -> list[str]:
    """Entries of the old folder to keep: not written by the new save and not a file of the old checkpoint."""
    marker = read_marker(old)
    listed = set(marker["files"]) if marker else set()
    kept = []
    for entry in sorted(os.listdir(old)):
        if layout.is_marker(entry) or entry in new_entries or entry in listed:
            continue
        if any(name.startswith(entry + "/") for name in listed):
            continue  # a folder the old checkpoint wrote (e.g. by a save hook)
        if (marker is None or marker.get("contributions")) and is_checkpoint_file(entry):
            continue  # another library's checkpoint file, or a file a process added (contributions.py): replaced
        kept.append(entry)
    return kept


def _finish_replacement(final: Path, aside: Path, is_checkpoint_file) -> None:
    """Move the old folder's own (non-checkpoint) entries into the new ``final``, then delete the old folder."""
    for entry in _carried_over(aside, set(os.listdir(final)), is_checkpoint_file):
        os.rename(aside / entry, final / entry)
    fsync_folder(final)
    shutil.rmtree(aside, ignore_errors=True)


def swap_into_place(staging: Path, final: Path,
                    is_checkpoint_file: Callable[[str], bool] = lambda name: False) -> None:
    """Rename the completed ``staging`` folder to ``final``, replacing what was there.

    Every step leaves a state ``recover_interrupted_swap`` can finish: the old folder is first moved aside
    (``.{name}.replaced``), the new one renamed in, then the old one's own files moved over and the rest deleted.
    """
    if not final.exists():
        os.rename(staging, final)
        fsync_folder(final.parent)
        return
    if not final.is_dir():
        raise NotADirectoryError(f"Cannot save a checkpoint to {final}: it is a file. Choose a folder name.")
    aside = replaced_folder(final)
    os.rename(final, aside)
    os.rename(staging, final)
    fsync_folder(final.parent)
    _finish_replacement(final, aside, is_checkpoint_file)


def recover_interrupted_swap(final: Path, is_checkpoint_file: Callable[[str], bool] = lambda name: False) -> None:
    """Finish (or undo) a replacement that a killed save left half done (see ``swap_into_place``)."""
    aside = replaced_folder(final)
    if not aside.is_dir():
        return
    if final.is_dir():
        _finish_replacement(final, aside, is_checkpoint_file)  # the new checkpoint was in place already
    else:
        os.rename(aside, final)  # the new one never arrived: the previous checkpoint comes back
        fsync_folder(final.parent)





def read_lock(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # being written right now, or damaged: treated as held (a live pid cannot be ruled out)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def lock_holder_alive(holder: Optional[dict]) -> bool:
    """Whether the save that wrote ``holder`` may still be running (unknowable for another host: yes)."""
    if holder is None:
        return False
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return True
    return _pid_running(holder["pid"])


class SaveLock:
    """``acquire()`` (creating an empty ``staging`` folder this save owns) or raise ``CheckpointError``
    naming the other writer; ``release(folder)`` once the folder was renamed; ``abandon()`` removes it all."""

    def __init__(self, final: Path, staging: Path):
        self.final = Path(final)
        self.staging = Path(staging)
        self.path = self.staging / LOCK_NAME
        self.held = False

    def acquire(self) -> None:
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
        for _ in range(3):
            self.staging.mkdir(parents=True, exist_ok=True)
            try:
                descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = read_lock(self.path)
                if holder is None:
                    continue  # released in between: try again
                if holder and not lock_holder_alive(holder):
                    shutil.rmtree(self.staging, ignore_errors=True)  # its process died: a stale save
                    continue
                self._refuse(holder)
            except FileNotFoundError:
                continue  # the folder was removed in between
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(record)
            try:
                entries = os.listdir(self.staging)
            except FileNotFoundError:
                continue  # removed with the new lock in it (a clean-up that found it before the lock): again
            self.held = True
            for entry in entries:  # what a killed save left behind
                if entry != LOCK_NAME:
                    target = self.staging / entry
                    shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
            return
        self._refuse(read_lock(self.path) or {})

    def _refuse(self, holder: dict) -> None:
        who = (f"process {holder.get('pid')} on host {holder.get('host')}" if holder.get("pid") is not None
               else "another process")
        since = holder.get("since")
        when = (f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"
                if isinstance(since, (int, float)) else "")
        raise CheckpointError(
            f"Cannot save to {self.final}: another job ({who}) is saving to the same folder{when} (lock file "
            f"{self.path}). Two runs writing one checkpoint folder would destroy each other's save: give each run its "
            "own folder / project_dir, or wait for the other save to finish. If no such job is running (it was killed "
            "on another machine), delete the lock file."
        )

    def release(self, folder: Path) -> None:
        """Drop the lock from ``folder``, where the staging folder now is."""
        if self.held:
            self.held = False
            (Path(folder) / LOCK_NAME).unlink(missing_ok=True)

    def abandon(self) -> None:
        if self.held:
            self.held = False
            shutil.rmtree(self.staging, ignore_errors=True)
