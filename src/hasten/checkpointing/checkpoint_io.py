"""Checkpoint IO: how a strategy's state becomes a format's files inside the staging folder, and back.

``saving.py`` / ``loading.py`` own the transaction (staging folder, hooks, completion marker, rotation,
agreement between processes, fallback past a damaged checkpoint) for every strategy; the IO object a strategy
holds only turns its state into a format's files (the formats own the names: ``formats.py``). Four steps, so the
transaction can put its own work between them:

- ``collect(strategy, targets)``: every state, in memory (collective for sharded backends); async saves copy it;
- ``write(staging, collected, ...)``: the files this process writes, given what and where (no strategy: the
  collected snapshot holds everything, an engine included); a sharded IO writes one set per rank into the folder;
- ``read(strategy, folder, marker, targets, ...)``: every file this process needs, read and checked, nothing applied;
- ``apply(strategy, loaded, targets, strict)``: apply it all, or put back what was applied and raise.

The default IO, ``FullStateCheckpointIO``, writes ``FullStateFormat``'s files (``full_files.py``) and reads any
folder whole (``full_state_reader.py``). Its ``Snapshot`` of everything a checkpoint holds is taken before anything
is written (a failing ``state_dict`` happens before the disk is touched, and the random states are those of the
moment ``save_state`` was called). The process that writes the shared files (``SaveTransaction.writes_shared_files``:
the main process, or each machine's without a shared file system) writes models, optimizers, schedulers, scaler and
registered objects; every process its own random states and loader positions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from . import layout
from .full_state_reader import LoadedState, apply_full_state, read_full_state
from .full_files import shared_file_writes, write_shared_files
from .parallel_writes import write_files
from .weights import state_dict_for_checkpoint
from .rng import capture_rng_states
from .targets import CheckpointTargets, loader_state
from .writers import write_pickle

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed import ProcessGroup

    from ..core.aliases import Device
    from .strategy_protocol import CheckpointingStrategy

__all__ = ["FullStateCheckpointIO", "Snapshot", "take_snapshot", "write_full_state", "write_shared_files",
           "write_process_files"]


class FullStateCheckpointIO:
    """The default: full (unsharded) state dicts in the reference library's file layout; the process writing
    the shared files writes models, optimizers, schedulers, scaler and registered objects, every process its
    random states and loader positions."""

    def collect(self, strategy: CheckpointingStrategy, targets: CheckpointTargets,
                options: Optional[dict] = None) -> Snapshot:
        return take_snapshot(strategy, targets)

    def write(self, staging: Path, collected: Snapshot, *, writes_shared_files: bool, process_index: int,
              safe_serialization: bool = True, process_group: Optional[ProcessGroup] = None) -> None:
        """``process_group``: the group a writer's collectives use (a background save's own); unused here."""
        write_full_state(staging, collected, writes_shared_files=writes_shared_files, process_index=process_index,
                         safe_serialization=safe_serialization)

    def read(self, strategy: CheckpointingStrategy, folder: Path, marker: Optional[dict], targets: CheckpointTargets,
             *, load_kwargs: Optional[dict] = None, device: Device = "cpu", strict: bool = True) -> LoadedState:
        return read_full_state(strategy, folder, marker, targets, load_kwargs, device, strict)

    def apply(self, strategy: CheckpointingStrategy, loaded: LoadedState, targets: CheckpointTargets,
              strict: bool = True) -> None:
        apply_full_state(strategy, loaded, targets, strict)


@dataclass
class Snapshot:
    weights: list = field(default_factory=list)  # one state dict per model, keyed as the prepared model
    optimizers: list = field(default_factory=list)
    schedulers: list = field(default_factory=list)
    scaler: Optional[dict] = None
    loaders: list = field(default_factory=list)  # this process's loader states (None: a loader without one)
    custom: list = field(default_factory=list)
    rng: dict = field(default_factory=dict)

    def recapture_rng(self) -> None:
        """Take the random states again, now: the save hooks ran after the snapshot was taken and may have drawn
        random numbers (diffusers' EMA ``save_pretrained`` does); the resumed run must draw what the uninterrupted
        one drew next, as with the reference library, which records the states after its hooks."""
        self.rng = capture_rng_states(step=self.rng.get("step", 0))


def take_snapshot(strategy: CheckpointingStrategy, targets: CheckpointTargets,
                  model_state: Optional[Callable[[nn.Module], dict]] = None,
                  optimizer_state: Optional[Callable[[Optional[nn.Module], torch.optim.Optimizer], dict]] = None,
                  ) -> Snapshot:
    """Collective under sharded strategies (their state dicts gather): every process calls it.
    ``model_state(model)`` / ``optimizer_state(model, optimizer)``: how to take those states (default: the
    strategy's full state dicts)."""
    model_state = model_state or (lambda model: state_dict_for_checkpoint(strategy, model))
    optimizer_state = optimizer_state or strategy.optimizer_state_dict
    return Snapshot(
        weights=[model_state(model) for model in targets.models],
        optimizers=[optimizer_state(targets.model_of(optimizer), optimizer) for optimizer in targets.optimizers],
        schedulers=[scheduler.state_dict() for scheduler in targets.schedulers],
        scaler=targets.scaler.state_dict() if targets.scaler is not None else None,
        loaders=[loader_state(loader) for loader in targets.dataloaders],
        custom=[obj.state_dict() for obj in targets.custom_objects],
        rng=capture_rng_states(step=targets.step),
    )


def write_full_state(staging: Path, snapshot: Snapshot, *, writes_shared_files: bool, process_index: int,
                     safe_serialization: bool = True) -> None:
    """Write ``snapshot`` into ``staging``: the shared files when this process writes them, its own always; the
    files side by side (``parallel_writes.py``)."""
    writes = shared_file_writes(staging, snapshot, safe_serialization) if writes_shared_files else []
    write_files(writes + process_file_writes(staging, snapshot, process_index))


def write_process_files(folder: Path, snapshot: Snapshot, process_index: int) -> None:
    """This process's own files: its random states and, when it has data loaders, their positions."""
    write_files(process_file_writes(folder, snapshot, process_index))


def process_file_writes(folder: Path, snapshot: Snapshot, process_index: int) -> list[Callable[[], None]]:
    writes = [partial(write_pickle, snapshot.rng, folder / layout.rng_file(process_index), checksum=True)]
    if snapshot.loaders:
        writes.append(partial(write_pickle, snapshot.loaders, folder / layout.loader_states_file(process_index),
                              checksum=True))
    return writes
