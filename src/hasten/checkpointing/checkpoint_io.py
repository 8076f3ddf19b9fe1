"""Checkpoint IO: how a strategy's state becomes files inside the staging folder, and back.

``saving.py`` / ``loading.py`` own the transaction (staging folder, hooks, completion marker, rotation,
agreement between processes, fallback past a damaged checkpoint) for every strategy; the IO object a strategy
holds owns only the files' contents. Four steps, so the transaction can put its own work between them:

- ``collect(strategy, targets)``: every state, in memory (collective for sharded backends); async saves copy it;
- ``write(strategy, staging, collected, ...)``: the files this process writes (a sharded IO writes one set per
  rank into the same folder);
- ``read(strategy, folder, marker, targets, ...)``: every file this process needs, read and checked, nothing applied;
- ``apply(strategy, loaded, targets, strict)``: apply it all, or put back what was applied and raise.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .full_state_reader import apply_full_state, read_full_state
from .full_state_writer import write_full_state
from .snapshot import take_snapshot
from .targets import CheckpointTargets

__all__ = ["FullStateCheckpointIO"]


class FullStateCheckpointIO:
    """The default: full (unsharded) state dicts in the reference library's file layout; the process writing
    the shared files writes models, optimizers, schedulers, scaler and registered objects, every process its
    random states and loader positions."""

    def collect(self, strategy, targets: CheckpointTargets):
        return take_snapshot(strategy, targets)

    def write(self, strategy, staging: Path, collected, *, writes_shared_files: bool, process_index: int,
              safe_serialization: bool = True, process_group=None) -> None:
        """``process_group``: the group a writer's collectives use (a background save's own); unused here."""
        write_full_state(staging, collected, writes_shared_files=writes_shared_files, process_index=process_index,
                         safe_serialization=safe_serialization)

    def read(self, strategy, folder: Path, marker: Optional[dict], targets: CheckpointTargets, *,
             load_kwargs: Optional[dict] = None, device="cpu", strict: bool = True):
        return read_full_state(strategy, folder, marker, targets, load_kwargs, device, strict)

    def apply(self, strategy, loaded, targets: CheckpointTargets, strict: bool = True) -> None:
        apply_full_state(strategy, loaded, targets, strict)
