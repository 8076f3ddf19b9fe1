"""One writer per checkpoint folder: a lock file in the staging folder while a save is in progress.

Two jobs saving to the same folder (two runs started with the same ``project_dir``, a job restarted while
its previous copy still runs) would otherwise delete each other's staging folder half way. The save that
starts first creates ``.hasten_lock`` in the staging folder (an exclusive create: exactly one wins) holding
its process id and host name; the other stops with an error naming them. A lock left by a process that died
(same host, that process id no longer running) is taken over, with what that save left; one from another
host is trusted until removed by hand, since whether its process runs cannot be checked from here. The lock
travels with the folder's rename and is deleted right after; it is never listed in the completion marker.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Optional

from .errors import CheckpointError

__all__ = ["SaveLock", "LOCK_NAME", "lock_holder_alive", "read_lock"]

LOCK_NAME = ".hasten_lock"


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
            self.held = True
            for entry in os.listdir(self.staging):  # what a killed save left behind
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
