"""Sharded checkpoint IO, ``ShardedFormat``'s writer and reader for the strategies that shard (FSDP2, FSDP1, tensor
and pipeline parallelism): every rank writes its own shards of the models and optimizers with
``torch.distributed.checkpoint`` (DCP), in the reference library's layout (``ShardedFormat``'s names:
``pytorch_model_fsdp_{i}/``, ``optimizer_{i}/``; checkpointing/sharded_files.py), inside the same staging folder.

Everything else (schedulers, scaler, registered objects, random states, loader positions) is written and read
by the full-state IO. Loading reshards: the shards are read into this run's layout, whatever the number of
processes that saved them. A folder with full files instead (``model.safetensors``: saved by another strategy)
is read as such, so checkpoints move both ways between sharded and unsharded runs.

The model's and optimizer's sharded state dicts are read into fresh copies and applied only after every process
has read and checked everything (names and shapes against the checkpoint's metadata), like the full-state IO.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol

import torch

from .checkpoint_io import Snapshot, take_snapshot, write_full_state
from .errors import CheckpointError, IncompleteCheckpointError
from .full_state_reader import LoadedState, apply_full_state, read_full_state
from .safe_dcp import SafeFileSystemReader, SafeLoadPlanner
from .safe_load import UNSAFE_OPT_IN, wants_weights_only
from .sharded_files import ShardedFormat
from .strategy_protocol import CheckpointingStrategy
from .targets import CheckpointTargets

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed import ProcessGroup

    from ..core.aliases import Device, NestedData

__all__ = ["ShardedCheckpointIO", "empty_like",
           "check_against_metadata", "load_shards"]


class _ShardingStrategy(CheckpointingStrategy, Protocol):
    """The strategy this IO serves (FSDP2 / FSDP1 and the model-parallel strategies built on FSDP2): it gives each
    rank's shards of the states."""

    def sharded_model_state_dict(self, model: nn.Module) -> dict: ...

    def sharded_optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> dict: ...


def empty_like(state: NestedData) -> NestedData:
    """A structure like ``state`` with fresh (uninitialised) tensors for DCP to load into."""
    if isinstance(state, torch.Tensor):
        return torch.empty_like(state)
    if isinstance(state, dict):
        return {key: empty_like(value) for key, value in state.items()}
    if isinstance(state, list):
        return [empty_like(value) for value in state]
    return state


def _saved_shapes(folder: Path) -> dict:
    """``{name: global shape}`` of every tensor a DCP checkpoint folder holds (read from its metadata)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = SafeFileSystemReader(str(folder), unsafe_hint=UNSAFE_OPT_IN).read_metadata()
    return {name: tuple(item.size) for name, item in metadata.state_dict_metadata.items()
            if isinstance(item, TensorStorageMetadata)}


def check_against_metadata(folder: Path, template: dict, prefix: str, strict: bool) -> None:
    """Every tensor of ``template`` must be in the checkpoint with the same global shape (clear error first)."""
    from .weights import flatten_names

    saved = _saved_shapes(folder)
    for name, tensor in flatten_names(template, prefix):
        if name not in saved:
            if strict or prefix != "model":
                raise CheckpointError(
                    f"{folder} has no {name!r}: it was saved from another model. Nothing was loaded. Load a "
                    "checkpoint of the same model (or pass strict=False to skip missing weights).")
            continue
        if saved[name] != tuple(tensor.shape):
            raise CheckpointError(
                f"{folder}: {name!r} has shape {saved[name]} in the checkpoint and {tuple(tensor.shape)} in the "
                "prepared model. Nothing was loaded. Load a checkpoint of the same model.")


class ShardedCheckpointIO:
    """Checkpoint IO for sharded strategies (FSDP ``SHARDED_STATE_DICT``): DCP folders per model and optimizer."""

    # ------------------------------------------------------------ saving
    def collect(self, strategy: _ShardingStrategy, targets: CheckpointTargets,
                options: Optional[dict] = None) -> Snapshot:
        """Every state, the models' and optimizers' as this rank's shards (no gathering)."""
        return take_snapshot(strategy, targets, model_state=strategy.sharded_model_state_dict,
                             optimizer_state=strategy.sharded_optimizer_state_dict)

    def write(self, staging: Path, collected: Snapshot, *, writes_shared_files: bool, process_index: int,
              safe_serialization: bool = True, process_group: Optional[ProcessGroup] = None) -> None:
        import torch.distributed.checkpoint as dcp

        for index, state in enumerate(collected.weights):
            dcp.save({"model": state}, checkpoint_id=str(staging / ShardedFormat.model_folder(index)),
                     process_group=process_group)
        for index, state in enumerate(collected.optimizers):
            dcp.save({"optimizer": state}, checkpoint_id=str(staging / ShardedFormat.optimizer_folder(index)),
                     process_group=process_group)
        rest = dataclasses.replace(collected, weights=[], optimizers=[])
        write_full_state(staging, rest, writes_shared_files=writes_shared_files, process_index=process_index,
                         safe_serialization=safe_serialization)

    # ------------------------------------------------------------ loading
    def read(self, strategy: _ShardingStrategy, folder: Path, marker: Optional[dict], targets: CheckpointTargets, *,
             load_kwargs: Optional[dict] = None, device: Device = "cpu", strict: bool = True) -> LoadedState:
        if not (folder / ShardedFormat.model_folder(0)).is_dir() and targets.models:
            return read_full_state(strategy, folder, marker, targets, load_kwargs, device, strict)  # full files
        weights_only = wants_weights_only(load_kwargs)
        targets.run_load_hooks(folder, strategy.unwrap)  # every model loads its shards
        rest = dataclasses.replace(targets, models=[], optimizers=[], load_hooks=[])
        loaded = read_full_state(strategy, folder, marker, rest, load_kwargs, device, strict)
        for index, model in enumerate(targets.models):
            path = self._require(folder, ShardedFormat.model_folder(index), f"model {index}")
            template = empty_like(strategy.sharded_model_state_dict(model))
            check_against_metadata(path, template, "model", strict)
            state = {"model": template}
            load_shards(state, path, allow_partial=not strict, weights_only=weights_only)
            loaded.models.append((model, state["model"]))
        for index, optimizer in enumerate(targets.optimizers):
            path = self._require(folder, ShardedFormat.optimizer_folder(index), f"optimizer {index}")
            template = empty_like(strategy.sharded_optimizer_state_dict(targets.model_of(optimizer), optimizer))
            check_against_metadata(path, template, "optimizer", True)
            state = {"optimizer": template}
            load_shards(state, path, allow_partial=False, weights_only=weights_only)
            loaded.optimizers.append((optimizer, state["optimizer"]))
        return loaded

    @staticmethod
    def _require(folder: Path, name: str, what: str) -> Path:
        path = folder / name
        if not (path / ".metadata").is_file():
            raise IncompleteCheckpointError(
                f"Checkpoint {folder} has no sharded state for {what} ({name}/.metadata is missing). Load a checkpoint "
                "saved with the same prepared objects.")
        return path

    def apply(self, strategy: _ShardingStrategy, loaded: LoadedState, targets: CheckpointTargets,
              strict: bool = True) -> None:
        apply_full_state(strategy, loaded, targets, strict)


def load_shards(state: dict, path: Path, allow_partial: bool, weights_only: bool = True) -> None:
    """Read the shards of ``path`` into ``state`` (resharded to this run), unpickling nothing but plain values
    unless ``weights_only=False`` (a checkpoint the caller trusts)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader

    if not weights_only:
        dcp.load(state, storage_reader=FileSystemReader(str(path)),
                 planner=DefaultLoadPlanner(allow_partial_load=allow_partial))
        return
    dcp.load(state, storage_reader=SafeFileSystemReader(str(path), unsafe_hint=UNSAFE_OPT_IN),
             planner=SafeLoadPlanner(allow_partial_load=allow_partial, unsafe_hint=UNSAFE_OPT_IN))
