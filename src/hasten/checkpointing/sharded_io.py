"""Sharded checkpoint IO, ``ShardedFormat``'s writer and reader for the strategies that shard (FSDP2, FSDP1, tensor
and pipeline parallelism): every rank writes its own shards of the models and optimizers with
``torch.distributed.checkpoint`` (DCP), in the reference library's layout (``ShardedFormat``'s names:
``pytorch_model_fsdp_{i}/``, ``optimizer_{i}/``; checkpointing/sharded_files.py), inside the same staging folder,
all of them with one ``dcp.save`` and read with one ``dcp.load`` (``dcp_folders.py``: DCP's planning collectives
once per checkpoint, not once per folder).

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
from typing import TYPE_CHECKING, Any, Optional, Protocol

import torch

from ..core.gc_pause import gc_paused
from . import dcp_folders
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

__all__ = ["ShardedCheckpointIO", "empty_like", "check_against_metadata", "shapes_in", "save_folders", "load_folders",
           "load_shards"]


class _ShardingStrategy(CheckpointingStrategy, Protocol):
    """The strategy this IO serves (FSDP2 / FSDP1 and the model-parallel strategies built on FSDP2): it gives each
    rank's shards of the states."""

    def sharded_model_state_dict(self, model: nn.Module) -> dict: ...

    def sharded_optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> dict: ...

    def sharded_state_dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]: ...


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
    return shapes_in(SafeFileSystemReader(str(folder), unsafe_hint=UNSAFE_OPT_IN).read_metadata())


def shapes_in(metadata: Any, folder: Optional[str] = None) -> dict:
    """``{name: global shape}`` of every tensor DCP ``metadata`` describes (with ``folder``: of that folder's, in
    a ``FolderSetReader``'s merged metadata, its prefix taken off)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    prefix = f"{folder}." if folder else ""
    return {name[len(prefix):]: tuple(item.size) for name, item in metadata.state_dict_metadata.items()
            if isinstance(item, TensorStorageMetadata) and name.startswith(prefix)}


def check_against_metadata(folder: Path, template: dict, prefix: str, strict: bool,
                           saved: Optional[dict] = None) -> None:
    """Every tensor of ``template`` must be in the checkpoint with the same global shape (clear error first).
    ``saved``: the folder's ``{name: shape}`` when already read (``shapes_in``)."""
    from .weights import flatten_names

    saved = _saved_shapes(folder) if saved is None else saved
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
        """Every state, the models' and optimizers' as this rank's shards (no gathering). A model that one optimizer
        trains has both states taken together (``sharded_state_dicts``)."""
        taken: dict = {}  # id(optimizer) -> its state, taken with its model's

        def model_state(model: nn.Module) -> dict:
            training = [optimizer for optimizer in targets.optimizers if targets.model_of(optimizer) is model]
            if len(training) != 1:
                return strategy.sharded_model_state_dict(model)
            weights, taken[id(training[0])] = strategy.sharded_state_dicts(model, training[0])
            return weights

        def optimizer_state(model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> dict:
            found = taken.pop(id(optimizer), None)
            return found if found is not None else strategy.sharded_optimizer_state_dict(model, optimizer)

        return take_snapshot(strategy, targets, model_state=model_state, optimizer_state=optimizer_state)

    def write(self, staging: Path, collected: Snapshot, *, writes_shared_files: bool, process_index: int,
              safe_serialization: bool = True, process_group: Optional[ProcessGroup] = None) -> None:
        folders = {ShardedFormat.model_folder(index): {"model": state} for index, state in enumerate(collected.weights)}
        folders.update({ShardedFormat.optimizer_folder(index): {"optimizer": state}
                        for index, state in enumerate(collected.optimizers)})
        save_folders(folders, staging, process_group)
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
        reader = dcp_folders.FolderSetReader(str(folder), self._folder_names(folder, targets),
                                             unsafe_hint=UNSAFE_OPT_IN)
        metadata = reader.read_metadata() if weights_only else None  # read once, for the checks and the load

        def check(name: str, template: dict, prefix: str, strict_here: bool) -> None:
            saved = shapes_in(metadata, name) if metadata is not None else None
            check_against_metadata(folder / name, template, prefix, strict_here, saved)

        folders: dict[str, dict] = {}
        for index, model in enumerate(targets.models):
            name = ShardedFormat.model_folder(index)
            template = empty_like(strategy.sharded_model_state_dict(model))
            check(name, template, "model", strict)
            folders[name] = {"model": template}
        for index, optimizer in enumerate(targets.optimizers):
            name = ShardedFormat.optimizer_folder(index)
            template = empty_like(strategy.sharded_optimizer_state_dict(targets.model_of(optimizer), optimizer))
            check(name, template, "optimizer", True)
            folders[name] = {"optimizer": template}
        load_folders(folders, folder, strict=strict, weights_only=weights_only, reader=reader)
        loaded.models += [(model, folders[ShardedFormat.model_folder(index)]["model"])
                          for index, model in enumerate(targets.models)]
        loaded.optimizers += [(optimizer, folders[ShardedFormat.optimizer_folder(index)]["optimizer"])
                              for index, optimizer in enumerate(targets.optimizers)]
        return loaded

    def _folder_names(self, folder: Path, targets: CheckpointTargets) -> list[str]:
        """The DCP folders a load of ``targets`` reads, each checked to be there."""
        names = [(ShardedFormat.model_folder(index), f"model {index}") for index in range(len(targets.models))]
        names += [(ShardedFormat.optimizer_folder(index), f"optimizer {index}")
                  for index in range(len(targets.optimizers))]
        return [self._require(folder, name, what).name for name, what in names]

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


def save_folders(folders: dict[str, dict], root: Path, process_group: Optional[ProcessGroup] = None) -> None:
    """Write ``{folder name: state}`` as DCP folders under ``root``: with one ``dcp.save`` (``dcp_folders.py``) where
    this PyTorch allows, else one per folder."""
    import torch.distributed.checkpoint as dcp

    if not folders:
        return
    if dcp_folders.available():
        with gc_paused():  # DCP's plans are many small objects (core/gc_pause.py)
            dcp.save(folders, storage_writer=dcp_folders.FolderSetWriter(str(root), list(folders)),
                     process_group=process_group, planner=cached_plans_planner(folders, process_group))
        return
    for name, state in folders.items():
        dcp.save(state, checkpoint_id=str(root / name), process_group=process_group,
                 planner=cached_plans_planner({name: state}, process_group))


def cached_plans_planner(folders: dict[str, Any], process_group: Optional[ProcessGroup] = None) -> Any:
    """DCP's default save planner with its plans kept for the next save of the same layout (torch's
    ``enable_plan_caching``: a rank whose local plan did not change sends an empty one, and the coordinator reuses the
    global plan and metadata instead of building and checking them again). Torch keeps one cache per key and, to find
    a change, compares only names, offsets and sizes; the key here is the layout itself (``layout_key``: every entry's
    name, and each tensor's dtype and global shape, with the size of the process group), the same on every process,
    so a save of another layout — another dtype included — gets a cache of its own instead of the kept metadata.
    None (DCP's default planner) on a PyTorch without plan caching."""
    import inspect

    from torch.distributed.checkpoint import DefaultSavePlanner

    if "enable_plan_caching" not in inspect.signature(DefaultSavePlanner).parameters:
        return None
    planner = DefaultSavePlanner(enable_plan_caching=True)
    planner._cached_plans_key = layout_key(folders, process_group)  # torch's own key is the class name alone
    return planner


def layout_key(state: Any, process_group: Optional[ProcessGroup] = None) -> str:
    """A digest of ``state``'s layout, equal on every process that holds the same entries: each entry's name, each
    tensor's dtype and global shape (a DTensor's, not its shard's), each other value's type; and the number of
    processes in ``process_group``."""
    import hashlib

    import torch.distributed as dist

    entries: list[str] = [str(dist.get_world_size(process_group) if dist.is_initialized() else 1)]

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            entries.append(f"{prefix}:{value.dtype}:{tuple(value.shape)}")
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(f"{prefix}.{index}", item)
        else:
            entries.append(f"{prefix}:{type(value).__name__}")

    walk("", state)
    return "hasten:" + hashlib.blake2b("\n".join(entries).encode(), digest_size=16).hexdigest()


def load_folders(folders: dict[str, dict], root: Path, *, strict: bool, weights_only: bool,
                 reader: Optional[dcp_folders.FolderSetReader] = None) -> None:
    """Read the DCP folders under ``root`` into ``{folder name: state}`` (resharded to this run): with one
    ``dcp.load`` (``dcp_folders.py``; ``reader``: one that already read the folders' metadata) for a strict,
    weights-only load, else folder by folder (``load_shards``; a model's folder then allows missing weights when
    not ``strict``)."""
    import torch.distributed.checkpoint as dcp

    if not folders:
        return
    if strict and weights_only:
        with gc_paused():  # DCP's plans are many small objects (core/gc_pause.py)
            dcp.load(folders, storage_reader=reader or dcp_folders.FolderSetReader(str(root), list(folders),
                                                                                   unsafe_hint=UNSAFE_OPT_IN),
                     planner=SafeLoadPlanner(allow_partial_load=False, unsafe_hint=UNSAFE_OPT_IN))
        return
    for name, state in folders.items():
        load_shards(state, root / name, allow_partial=not strict and "model" in state, weights_only=weights_only)


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
