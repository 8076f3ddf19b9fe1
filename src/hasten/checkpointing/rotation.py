"""Automatically named checkpoints: ``{project_dir}/checkpoints/checkpoint_{iteration}``, which one is the
newest complete one, and keeping only the newest ``total_limit``.

Differences from the reference library, which deletes old checkpoints *before* writing the new one and
picks the newest folder whether or not its save finished:

* old checkpoints are deleted only after the new one is complete, so a save that dies never leaves fewer
  checkpoints than ``total_limit`` (with ``total_limit=1``, the reference can leave none);
* the checkpoint just written is never deleted, whatever its number;
* ``load_state()`` takes the newest checkpoint whose save completed; unfinished saves are skipped.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from .atomic import is_complete, is_staging_name, remove_folder
from .errors import CheckpointNotFoundError
from .contributions import missing_processes
from .layout import CHECKPOINTS_FOLDER, automatic_folder, automatic_iteration
from .atomic import LOCK_NAME, STAGING_SUFFIX, lock_holder_alive, read_lock

if TYPE_CHECKING:
    from ..config.project import ProjectConfiguration

__all__ = ["checkpoints_root", "next_automatic_folder", "list_checkpoints", "complete_checkpoints",
           "newest_complete_checkpoint",
           "require_newest_complete_checkpoint", "enforce_total_limit", "remove_stale_staging"]

logger = logging.getLogger(__name__)


def checkpoints_root(project_configuration: ProjectConfiguration) -> Path:
    """``{project_dir}/checkpoints``; a clear error when the project has no folder."""
    if project_configuration.project_dir is None:
        raise ValueError(
            "Automatic checkpoint naming needs a project folder: pass Accelerator(project_dir=...) or "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    return Path(project_configuration.project_dir) / CHECKPOINTS_FOLDER


def next_automatic_folder(project_configuration: ProjectConfiguration, must_be_new: bool = True) -> Path:
    """The folder the next automatic save writes, ``checkpoint_{iteration}``; it must not exist yet, unless it is one
    that a process was killed while adding its files to (it cannot be loaded; the save replaces it).
    ``must_be_new=False``: a process adding its files to the folder the main process saves by itself, which may have
    completed it already."""
    checkpoints_root(project_configuration)  # the project_dir check
    folder = Path(automatic_folder(project_configuration.project_dir, project_configuration.iteration))
    if must_be_new and folder.exists() and not missing_processes(folder):
        raise ValueError(
            f"Checkpoint folder {folder} already exists (iteration {project_configuration.iteration}). To continue "
            "a run, load its state first (accelerator.load_state() moves the iteration past the newest "
            "checkpoint); to start over in the same project, set ProjectConfiguration(iteration=...) past it or "
            "remove the old checkpoints."
        )
    return folder


def list_checkpoints(root: Union[str, os.PathLike]) -> list[tuple[int, Path]]:
    """``(iteration, folder)`` of every ``checkpoint_{n}`` folder under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for entry in os.listdir(root):
        iteration = automatic_iteration(entry)
        if iteration is not None and (root / entry).is_dir():
            found.append((iteration, root / entry))
    return sorted(found)


def complete_checkpoints(root: Union[str, os.PathLike]) -> list[Path]:
    """The checkpoints under ``root`` whose save completed, newest first; folders skipped are logged."""
    complete = []
    for iteration, folder in reversed(list_checkpoints(root)):
        missing = missing_processes(folder) if is_complete(folder) else None
        if missing == []:
            complete.append(folder)
        elif missing and not complete:
            logger.warning("Skipping %s: process(es) %s were stopped while adding their files to it (pass it to "
                           "load_state explicitly to see the error).", folder, ", ".join(map(str, missing)))
        elif not complete:
            logger.warning("Skipping %s: it has no completion marker (its save did not finish, or another library "
                           "wrote it; pass it to load_state explicitly to load it anyway).", folder)
    return complete


def newest_complete_checkpoint(root: Union[str, os.PathLike]) -> Optional[Path]:
    """The newest checkpoint under ``root`` whose save completed, or None; folders skipped are logged."""
    complete = complete_checkpoints(root)
    return complete[0] if complete else None


def require_newest_complete_checkpoint(root: Union[str, os.PathLike]) -> Path:
    folder = newest_complete_checkpoint(root)
    if folder is None:
        present = [path.name for _, path in list_checkpoints(root)]
        detail = (f"the folders there ({', '.join(present)}) have no completion marker; pass one to "
                  "load_state(input_dir) to load it anyway" if present else "there are none")
        raise CheckpointNotFoundError(f"No complete checkpoint to load in {root}: {detail}.")
    return folder


def enforce_total_limit(root: Union[str, os.PathLike], total_limit: Optional[int], keep: Path) -> list[Path]:
    """Delete the oldest checkpoints so that at most ``total_limit`` remain, never ``keep`` (the one just
    written); returns the deleted folders."""
    if total_limit is None:
        return []
    keep = Path(keep).resolve()
    others = [folder for _, folder in list_checkpoints(root) if folder.resolve() != keep]
    # a checkpoint that a process was killed while adding its files to cannot be loaded: it goes first
    others.sort(key=lambda folder: not missing_processes(folder))
    excess = len(others) + 1 - total_limit
    doomed = others[:max(0, excess)]
    if doomed:
        logger.info("total_limit=%d: deleting %s.", total_limit, ", ".join(folder.name for folder in doomed))
    for folder in doomed:
        remove_folder(folder)
    return doomed


def remove_stale_staging(root: Union[str, os.PathLike], saving: Optional[str] = None) -> None:
    """Delete what killed saves left in ``root`` (unfinished staging folders, half-deleted checkpoints).

    The staging folders of ``saving`` (the checkpoint being written now) are left to their owners: the other
    processes create theirs while this runs, and a folder between its creation and its lock file would look stale.
    Each owner's ``SaveLock`` takes over a stale one of its own."""
    root = Path(root)
    if not root.is_dir():
        return
    for entry in os.listdir(root):
        name = re.sub(r"\.process_\d+$", "", entry.lstrip(".").rsplit(".", 1)[0])  # a process's own (contributions.py)
        if not is_staging_name(entry) or automatic_iteration(name) is None:
            continue
        if name == saving and entry.endswith(STAGING_SUFFIX):
            continue  # this save's own, or one another process is claiming right now
        if lock_holder_alive(read_lock(root / entry / LOCK_NAME)):
            continue  # another job is saving that checkpoint right now
        shutil.rmtree(root / entry, ignore_errors=True)
