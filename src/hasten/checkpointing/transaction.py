"""One save across processes: who prepares the staging folder, who writes the shared files, who completes it.

The main process writes the files every process shares (models, optimizers, schedulers, scaler, registered
objects) and completes the save (marker, rename); every process writes its own random states and loader
positions into the same staging folder. With ``save_on_each_node`` the main process of every machine that
does not see the main process's folder (no shared file system) does the same on its own disk, and so does a
process that was given a folder other than the main process's.

A process that writes a whole checkpoint into a folder other than the main process's (each process given a folder
of its own, as scripts under Ray Train do, then report it) names its completion marker after itself
(``hasten_checkpoint.process_{rank}.json``): every file name then belongs to one process or holds the same bytes in
every such folder, so the folders copied into one by an engine or ``cp -r`` form one checkpoint, in which each
process checks the files against its own marker (``atomic.marker_for``).

The process that creates a staging folder takes its lock (``SaveLock`` in ``checkpointing/atomic.py``), so a second
job saving to the same folder stops with an error instead of deleting this one's files.

Each step ends with every process agreeing (``agreement.together``), so a failure anywhere stops all of
them with an error, and the staging folder of a failed save is removed.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from ..state import PartialState
from .agreement import from_main_process, together, together_reporting
from .checksums import noted_under
from .atomic import recover_interrupted_swap, staging_folder, swap_into_place, write_marker
from .errors import CheckpointError
from .formats import is_checkpoint_file
from .layout import MARKER_NAME, process_marker_file
from .atomic import SaveLock

if TYPE_CHECKING:
    from ..collectives.process_view import ProcessView

__all__ = ["SaveTransaction"]

_OWNER_FILE = ".hasten_owner"


class SaveTransaction:
    """Stages, writes and completes one checkpoint folder (see the module docstring)."""

    def __init__(self, final: Path, save_on_each_node: bool = False, processes: Optional[ProcessView] = None,
                 own_folder: bool = False):
        self.final = Path(os.path.abspath(os.fspath(final)))
        self.staging = staging_folder(self.final)
        self.save_on_each_node = save_on_each_node
        self.processes = processes  # who takes part (participation.py); None: every process
        self.state = processes or PartialState()
        self.writes_shared_files = False
        self.lock = SaveLock(self.final, self.staging)
        self._known_checksums: dict[str, str] = {}  # relative path -> checksum, as the processes computed them
        self.own_folder = own_folder  # this process saves apart from the main process (known by ``begin`` else)

    # ------------------------------------------------------------------ preparing
    def _claim(self, token: str) -> None:
        """Make a fresh staging folder (removing one a killed save left) and sign it with ``token``."""
        self.lock.acquire()  # an empty staging folder, or an error naming the other job saving here
        recover_interrupted_swap(self.final, is_checkpoint_file)
        (self.staging / _OWNER_FILE).write_text(token, encoding="utf-8")
        self.writes_shared_files = True

    def _sees(self, token: str) -> bool:
        try:
            return (self.staging / _OWNER_FILE).read_text(encoding="utf-8") == token
        except OSError:
            return False

    def begin(self) -> None:
        """Collective: create the staging folder where it is needed; every process can then write into it."""
        # the main process's token and folder, in one exchange: a process given another folder (each process
        # saving into a temporary folder of its own, as some scripts do) writes a complete checkpoint there itself
        sent = [uuid.uuid4().hex, str(self.final)] if self.state.is_main_process else [None, None]
        from_main_process(sent, self.processes)
        token, own_folder = sent[0], sent[1] != str(self.final)
        self.own_folder = self.own_folder or own_folder
        main = self.state.is_main_process or own_folder
        try:
            together("preparing the checkpoint folder", lambda: self._claim(token) if main else None,
                     processes=self.processes)
        except BaseException:
            self.abandon()
            raise
        if self.save_on_each_node and self.state.is_local_main_process and not self.state.is_main_process:
            # another machine: claim a folder of its own unless it shares the main process's file system
            together("preparing the checkpoint folder", lambda: None if self._sees(token) else self._claim(token),
                     processes=self.processes)
        elif self.save_on_each_node:
            together("preparing the checkpoint folder", lambda: None, processes=self.processes)
        try:
            together("preparing the checkpoint folder", self._check_visible, processes=self.processes)
        except BaseException:
            self.abandon()
            raise

    def agree_over(self, processes: ProcessView) -> None:
        """The rest of this save agrees over ``processes``: the same processes in the same order, on another group
        (the one an asynchronous save's background thread uses, ``async_save.completion_view``)."""
        self.processes = self.state = processes

    def _check_visible(self) -> None:
        if not self.staging.is_dir():
            raise CheckpointError(
                f"The checkpoint folder {self.staging} that the main process created is not visible from process "
                f"{self.state.process_index}: processes on different machines do not share this file system. "
                "Save to a shared file system, or set ProjectConfiguration(save_on_each_node=True)."
            )

    # ------------------------------------------------------------------ writing and completing
    def write(self, function: Callable[[Path], None], during: str = "writing the checkpoint") -> None:
        """Collective: every process runs ``function(staging_folder)``; on any failure the save is abandoned. Each
        process hands in the checksums of the files it wrote (``checksums.noted_under``), so that the marker's
        writer does not read every process's files back."""
        try:
            _, reports = together_reporting(during, function, self.staging,
                                            report=lambda: (str(self.staging), noted_under(self.staging)),
                                            processes=self.processes)
        except BaseException:
            self.abandon()
            raise
        for folder, found in filter(None, reports):  # a process saving into a folder of its own reports for that one
            if folder == str(self.staging):
                self._known_checksums.update(found)

    def _complete(self, metadata: dict) -> None:
        (self.staging / _OWNER_FILE).unlink(missing_ok=True)
        index = PartialState().process_index
        name = process_marker_file(index) if self.own_folder and index != 0 else MARKER_NAME
        write_marker(self.staging, metadata, self._known_checksums, name=name)
        swap_into_place(self.staging, self.final, is_checkpoint_file)
        self.lock.release(self.final)

    def complete(self, function: Callable[[], None]) -> None:
        """Collective: every process runs ``function``, in which the writer of the shared files completes the
        checkpoint (``_complete``); on any failure the save is abandoned."""
        try:
            together("completing the checkpoint", function, processes=self.processes)
        except BaseException:
            self.abandon()
            raise

    def commit(self, metadata: dict) -> None:
        """Collective: write the completion marker and rename the staging folder into place."""
        try:
            writer = self.writes_shared_files
            together("completing the checkpoint", lambda: self._complete(metadata) if writer else None,
                     processes=self.processes)
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Remove this save's staging folder (the previous checkpoint, if any, is untouched)."""
        if self.writes_shared_files:
            self.lock.abandon()
