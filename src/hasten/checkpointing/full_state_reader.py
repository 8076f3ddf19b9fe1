"""The neutral checkpoint reader: every file a process needs, read whole, checked against the live objects, then
applied.

``read_full_state`` reads EVERY file this process needs into memory and checks it against the prepared objects
(model keys and shapes, optimizer parameter groups, the random states' fields) without changing anything;
``apply_full_state`` then applies it all, models last, and puts back what it already applied if a step fails.
Between the two, ``loading.py`` makes every process agree that reading succeeded everywhere.

Each model's weights and optimizer's state are found and read through the formats (``formats.py``: full files,
DCP folders, an engine's own folder), so a checkpoint any strategy wrote loads under any other; this reader names
none of them. Schedulers, the scaler and registered objects are always full files (``FullStateFormat``), random
states and loader positions the folder's own files (``layout.py``).
"""
from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch

from ..state import PartialState
from . import layout
from .contributions import recorded_files
from .errors import CheckpointError, CorruptCheckpointError, IncompleteCheckpointError
from .formats import locate
from .full_files import FullStateFormat
from .weights import prepare_loaded_state
from .rng import capture_rng_states, restore_rng_states
from .safe_load import load_pickle_file
from .targets import CheckpointTargets, loader_state

if TYPE_CHECKING:
    from ..core.aliases import Device
    from .formats import CheckpointFormat
    from .strategy_protocol import CheckpointingStrategy

__all__ = ["LoadedState", "read_full_state", "apply_full_state", "model_location"]

logger = logging.getLogger(__name__)


def model_location(folder: Path, index: int) -> tuple[CheckpointFormat, Path]:
    """``(format, path)``: where model ``index``'s weights are in ``folder``, and the format that reads them; an error
    when no format holds them."""
    found = locate(Path(folder), index, "model")
    if found is None:
        raise IncompleteCheckpointError(
            f"Checkpoint {folder} has no weights for model {index}: neither {FullStateFormat.model_file(index)} nor "
            f"{FullStateFormat.model_file(index, False)} exists. Load a checkpoint saved with the same prepared models."
        )
    return found


def _require(folder: Path, name: str, what: str) -> Path:
    """``folder / name``, else an error naming what is missing."""
    path = folder / name
    if not path.is_file():
        raise IncompleteCheckpointError(
            f"Checkpoint {folder} is incomplete: {name} ({what}) is missing. Load a checkpoint saved with the same "
            "prepared objects."
        )
    return path


def _optimizer_location(folder: Path, index: int) -> tuple:
    found = locate(folder, index, "optimizer")
    if found is None:
        _require(folder, FullStateFormat.optimizer_file(index), f"optimizer {index}")  # raises: names the file
    return found


def _count(folder: Path, name_of) -> int:
    count = 0
    while (folder / name_of(count)).is_file():
        count += 1
    return count


def _parameter_names(strategy, path: Path, owner, optimizer):
    """``names()`` for a format reading an optimizer state keyed by parameter name: the prepared optimizer's
    parameter names per group; a clear error when it trains no prepared model."""
    def names() -> list:
        if owner is None:
            raise CheckpointError(f"{path.name} in {path.parent} keys the optimizer's state by parameter name, and the "
                                  f"prepared {type(optimizer).__name__} trains no prepared model: prepare its model "
                                  "too.")
        return strategy.optimizer_parameter_names(owner, optimizer)
    return names


class _Plan:
    """Every file this process will read, found (or reported missing) before anything is loaded."""

    def __init__(self, targets: CheckpointTargets, folder: Path, marker: Optional[dict], models: list):
        state = PartialState()
        self.models = [model_location(folder, index) for index in range(len(models))]  # (format, path) pairs
        self.optimizers = [_optimizer_location(folder, i) for i in range(len(targets.optimizers))]
        self.schedulers = [_require(folder, FullStateFormat.scheduler_file(i), f"scheduler {i}")
                           for i in range(len(targets.schedulers))]
        self.scaler = (_require(folder, FullStateFormat.SCALER_NAME, "the fp16 gradient scaler")
                       if targets.scaler is not None else None)
        saved_custom = sorted(name for name in os.listdir(folder) if FullStateFormat.is_custom_object_file(name))
        if len(saved_custom) != len(targets.custom_objects):
            raise IncompleteCheckpointError(
                f"Checkpoint {folder} holds {len(saved_custom)} registered object(s) but this run registered "
                f"{len(targets.custom_objects)} with register_for_checkpointing: register the same objects, in "
                "the same order, as the run that saved it."
            )
        self.custom = [_require(folder, FullStateFormat.custom_object_file(i), f"registered object {i}")
                       for i in range(len(targets.custom_objects))]
        saved_processes = marker.get("num_processes") if marker else None
        self.same_layout = saved_processes in (None, state.num_processes)
        rng = folder / layout.rng_file(state.process_index)
        loaders = folder / layout.loader_states_file(state.process_index)
        # the main process wrote it alone (participation.py): this process's own files count with their record
        alone = bool(marker and (marker.get("saved_alone") or marker.get("contributions"))
                     and rng.name not in marker["files"])
        if alone:
            added = recorded_files(folder, marker, state.process_index)  # checked before reading (loading.py)
            own_rng = rng.name in added
            if loaders.name not in added:  # every data-parallel process's loader is at the same position
                loaders = folder / layout.loader_states_file(0)
        else:
            own_rng = True
        self.rng = rng if self.same_layout and own_rng and rng.is_file() else None
        self.loaders = loaders if self.same_layout and loaders.is_file() and targets.dataloaders else None
        if not self.same_layout:
            logger.warning(
                "%s was saved by %s processes and this run has %d: models, optimizers and schedulers are loaded, "
                "but random states and data loader positions are per process and are not restored: the loaders "
                "start from the beginning (continue mid-epoch with skip_first_batches).",
                folder, saved_processes, state.num_processes)
        elif self.rng is None and alone:
            logger.warning("%s holds no random states of process %d (%s): save_state was called on the main process "
                           "only (as diffusers' scripts do), or each process saved into a folder of its own and only "
                           "the main process's was kept (as when only rank 0 reports it to Ray Train), so this "
                           "process's random generators keep their current state, as with the reference library.",
                           folder, state.process_index, rng.name)
        elif self.rng is None:
            if marker is not None:
                raise IncompleteCheckpointError(f"Checkpoint {folder} is incomplete: {rng.name} is missing.")
            logger.warning("%s has no %s: the random generators keep their current state.", folder, rng.name)
        if self.same_layout and self.loaders is None and targets.dataloaders:
            reference = [name for name in os.listdir(folder) if name.split(".")[0].rstrip("_0123456789")
                         in FullStateFormat.REFERENCE_LOADER_NAMES]
            logger.warning(
                "%s has no data loader positions for this process (%s)%s: the prepared loaders start their current "
                "epoch from the beginning; resume mid-epoch with skip_first_batches.", folder, loaders.name,
                f"; the reference library's {', '.join(sorted(reference))} use(s) another format" if reference else "")
        extra = _count(folder, FullStateFormat.optimizer_file) - len(self.optimizers)
        if extra > 0:
            logger.warning("%s holds %d more optimizer state(s) than this run prepared; they are not loaded.",
                           folder, extra)


# ----------------------------------------------------------------------------- 2. read and check everything
@dataclass
class LoadedState:
    """Every state this process will apply, read from the files and checked, nothing applied yet."""
    models: list = field(default_factory=list)
    optimizers: list = field(default_factory=list)
    schedulers: list = field(default_factory=list)
    scaler: object = None
    custom: list = field(default_factory=list)
    loaders: object = None
    rng: object = None


def _check_model(folder: Path, path: Path, strategy, model, state: dict, strict: bool) -> None:
    expected = strategy.expected_state_dict(model)
    problems = []
    if strict:
        missing = [key for key in expected if key not in state]
        unexpected = [key for key in state if key not in expected]
        if missing:
            problems.append(f"Missing key(s) in state_dict: {', '.join(missing[:8])}"
                            f"{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            problems.append(f"Unexpected key(s) in state_dict: {', '.join(unexpected[:8])}"
                            f"{' ...' if len(unexpected) > 8 else ''}")
    for key, value in state.items():
        live = expected.get(key)
        if isinstance(live, torch.Tensor) and isinstance(value, torch.Tensor) and live.shape != value.shape:
            problems.append(f"size mismatch for {key}: {tuple(value.shape)} in the file, {tuple(live.shape)} in "
                            "the model")
    if problems:
        raise CheckpointError(
            f"{path.name} in {folder} does not fit the prepared model: {'; '.join(problems)}. Nothing was loaded. "
            "Load a checkpoint of the same model (or pass strict=False to skip missing and unexpected keys)."
        )


def _check_optimizer(path: Path, optimizer, state, live: list) -> None:
    """``live``: the number of parameters in each of the prepared optimizer's groups."""
    if not isinstance(state, dict):
        raise CorruptCheckpointError(f"{path.name} in {path.parent} does not hold an optimizer state "
                                     f"(found a {type(state).__name__}). Load another checkpoint.")
    saved_groups = state.get("param_groups")
    if not isinstance(saved_groups, list):
        return  # a backend's own format: its load_state_dict checks it
    saved = [len(group.get("params", ())) if isinstance(group, dict) else None for group in saved_groups]
    if saved != live:
        raise CheckpointError(
            f"{path.name} in {path.parent} was saved for an optimizer with parameter groups of sizes {saved}; the "
            f"prepared one has {live}. Nothing was loaded. Load a checkpoint of the same model and optimizer."
        )


def _check_dict(path: Path, what: str, state) -> None:
    if not isinstance(state, dict):
        raise CorruptCheckpointError(f"{path.name} in {path.parent} does not hold {what} (found a "
                                     f"{type(state).__name__}). Load another checkpoint.")


def read_full_state(strategy: CheckpointingStrategy, folder: Path, marker: Optional[dict], targets: CheckpointTargets,
                    load_kwargs: Optional[dict], device: Device, strict: bool) -> LoadedState:
    """Read and check every file of ``folder`` this process needs; nothing is applied (see the module doc)."""
    models = targets.run_load_hooks(folder, strategy.unwrap)
    plan = _Plan(targets, folder, marker, models)
    for fmt, _ in plan.models + plan.optimizers:  # a format of pickles (an engine's) refuses before any read
        fmt.check_trusted(folder, marker, load_kwargs)
    loaded = LoadedState()
    for index, (model, (fmt, path)) in enumerate(zip(models, plan.models)):
        state = fmt.read_weights(path, f"weights of model {index}", device=device, load_kwargs=load_kwargs)
        if not isinstance(state, dict):
            raise CorruptCheckpointError(f"{path.name} in {folder} does not hold model weights (found a "
                                         f"{type(state).__name__}). Load another checkpoint.")
        state = prepare_loaded_state(strategy, model, state)
        _check_model(folder, path, strategy, model, state, strict)
        loaded.models.append((model, state))
    for index, (optimizer, (fmt, path)) in enumerate(zip(targets.optimizers, plan.optimizers)):
        owner = targets.model_of(optimizer)
        state = fmt.read_optimizer(path, f"optimizer {index}", _parameter_names(strategy, path, owner, optimizer),
                                   device=device, load_kwargs=load_kwargs)
        _check_optimizer(path, optimizer, state, strategy.optimizer_group_sizes(owner, optimizer))
        loaded.optimizers.append((optimizer, state))
    for index, (scheduler, path) in enumerate(zip(targets.schedulers, plan.schedulers)):
        state = load_pickle_file(path, f"scheduler {index}", load_kwargs=load_kwargs)
        _check_dict(path, "a scheduler state", state)
        loaded.schedulers.append((scheduler, state))
    if plan.scaler is not None:
        loaded.scaler = load_pickle_file(plan.scaler, "the gradient scaler", load_kwargs=load_kwargs)
        _check_dict(plan.scaler, "a gradient scaler state", loaded.scaler)
    for index, (obj, path) in enumerate(zip(targets.custom_objects, plan.custom)):
        loaded.custom.append((obj, load_pickle_file(path, f"registered object {index}", map_location="cpu",
                                                    load_kwargs=load_kwargs)))
    if plan.loaders is not None:
        states = load_pickle_file(plan.loaders, "data loader positions", load_kwargs=load_kwargs)
        if not isinstance(states, (list, tuple)):
            raise CorruptCheckpointError(f"{plan.loaders.name} in {folder} does not hold data loader positions. "
                                         "Load another checkpoint.")
        if len(states) != len(targets.dataloaders):
            logger.warning("%s holds positions for %d data loader(s), this run prepared %d: they are matched in the "
                           "order they were prepared.", folder, len(states), len(targets.dataloaders))
        loaded.loaders = [(loader, state) for loader, state in zip(targets.dataloaders, states)
                          if state is not None and callable(getattr(loader, "load_state_dict", None))]
    if plan.rng is not None:
        states = load_pickle_file(plan.rng, f"random states of process {PartialState().process_index}",
                                  load_kwargs=load_kwargs)
        _check_dict(plan.rng, "random states", states)
        missing = [key for key in ("random_state", "numpy_random_seed", "torch_manual_seed") if key not in states]
        if missing:
            raise CorruptCheckpointError(f"{plan.rng.name} in {folder} holds no {', '.join(missing)}: it is not a "
                                         "saved random state. Load another checkpoint.")
        loaded.rng = (states, str(plan.rng))
    return loaded


# ----------------------------------------------------------------------------- 3. apply, or put back
def _copy(value):
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - an object that cannot be copied is put back as it is referenced
        return value


def apply_full_state(strategy: CheckpointingStrategy, loaded: LoadedState, targets: CheckpointTargets,
                     strict: bool) -> None:
    """Apply what ``read_full_state`` read, models last; on failure put back what was applied, then raise."""
    undo = []  # (function, argument) pairs that put back what was applied, run in reverse on failure
    try:
        for optimizer, state in loaded.optimizers:
            undo.append((lambda o, s: o.load_state_dict(s), optimizer, optimizer.state_dict()))  # its own state
            strategy.load_optimizer_state_dict(targets.model_of(optimizer), optimizer, state)
        for scheduler, state in loaded.schedulers:
            undo.append((lambda o, s: o.load_state_dict(s), scheduler, _copy(scheduler.state_dict())))
            scheduler.load_state_dict(state)
        if loaded.scaler is not None:
            undo.append((lambda o, s: o.load_state_dict(s), targets.scaler, _copy(targets.scaler.state_dict())))
            targets.scaler.load_state_dict(loaded.scaler)
        for obj, state in loaded.custom:
            undo.append((lambda o, s: o.load_state_dict(s), obj, _copy(obj.state_dict())))
            obj.load_state_dict(state)
        for loader, state in loaded.loaders or ():
            current = loader_state(loader)
            if current is not None:
                undo.append((lambda o, s: o.load_state_dict(s), loader, _copy(current)))
            loader.load_state_dict(state)
        if loaded.rng is not None:
            states, source = loaded.rng
            undo.append((lambda o, s: (restore_rng_states(s), targets.set_step(o)), targets.step,
                         capture_rng_states()))
            restore_rng_states(states, source=source)
            if "step" in states:
                targets.set_step(int(states["step"]))
        for model, state in loaded.models:  # last: a model's weights cannot be put back without a copy
            strategy.load_model_state_dict(model, state, strict=strict)
    except BaseException:
        for function, target, previous in reversed(undo):
            try:
                function(target, previous)
            except Exception:  # noqa: BLE001 - keep putting back the others; the original error is raised
                logger.exception("Could not put back the state of %r after a failed load.", target)
        raise
