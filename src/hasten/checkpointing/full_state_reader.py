"""The default checkpoint reader: full state dicts, read, checked against the live objects, then applied.

``read_full_state`` reads EVERY file this process needs into memory and checks it against the prepared objects
(model keys and shapes, optimizer parameter groups, the random states' fields) without changing anything;
``apply_full_state`` then applies it all, models last, and puts back what it already applied if a step fails.
Between the two, ``loading.py`` makes every process agree that reading succeeded everywhere.

Besides full files and DCP shards, a model's weights and optimizer state may be an engine's own checkpoint folder
(DeepSpeed's): the strategy lists the formats it can read whole as ``strategy.engine_checkpoint_formats``
(``EngineCheckpointFormat``), so this reader names no backend.
"""
from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol, Sequence

import torch

from ..state import PartialState
from . import layout
from .contributions import recorded_files
from .errors import CheckpointError, CorruptCheckpointError, IncompleteCheckpointError
from .model_files import prepare_loaded_state
from .optimizer_names import by_position
from .rng import capture_rng_states, restore_rng_states
from .safe_load import load_pickle_file, load_safetensors_file
from .sharded_files import ShardedFormat, is_sharded_folder, model_weights_from_shards, optimizer_state_from_shards
from .targets import CheckpointTargets, loader_state

__all__ = ["LoadedState", "read_full_state", "apply_full_state", "model_path", "EngineCheckpointFormat"]

logger = logging.getLogger(__name__)


class EngineCheckpointFormat(Protocol):
    """An engine's own checkpoint of one model and its optimizer, which the full-state reader can read whole."""

    def folder(self, checkpoint: Path, index: int) -> Path:
        """Where model ``index``'s engine checkpoint is inside ``checkpoint``."""

    def recognises(self, path: Path) -> bool:
        """Whether ``path`` is such a checkpoint."""

    def check_trusted(self, checkpoint: Path, marker: Optional[dict], load_kwargs: Optional[dict]) -> None:
        """Raise before anything is read when the files may not be unpickled."""

    def read_weights(self, path: Path) -> dict:
        """The model's full state dict."""

    def read_optimizer(self, path: Path) -> tuple:
        """``(state keyed by parameter name, param_groups)`` of the optimizer."""


def _engine_format(path: Path, formats: Sequence[EngineCheckpointFormat]):
    return next((fmt for fmt in formats if path.is_dir() and fmt.recognises(path)), None)


def model_path(folder: Path, index: int, formats: Sequence[EngineCheckpointFormat] = ()) -> Path:
    safe = folder / layout.model_file(index, True)
    if safe.is_file():
        return safe
    pickled = folder / layout.model_file(index, False)
    if pickled.is_file():
        return pickled
    sharded = folder / ShardedFormat.model_folder(index)
    if ShardedFormat.recognises(sharded):  # written per rank by a sharded strategy: read whole here
        return sharded
    gathered = folder / ShardedFormat.gathered_model_file(index)
    if gathered.is_file():  # the reference library's FSDP full state dict
        return gathered
    for fmt in formats:  # an engine's own checkpoint: rebuilt whole here
        engine = fmt.folder(folder, index)
        if _engine_format(engine, (fmt,)) is not None:
            return engine
    raise IncompleteCheckpointError(
        f"Checkpoint {folder} has no weights for model {index}: neither {safe.name} nor {pickled.name} exists. "
        "Load a checkpoint saved with the same prepared models."
    )


def _require(folder: Path, name: str, what: str, sharded: Optional[str] = None) -> Path:
    """``folder / name``, or the DCP folder ``sharded`` a sharded strategy wrote instead; else an error."""
    path = folder / name
    if sharded is not None and not path.is_file() and is_sharded_folder(folder / sharded):
        return folder / sharded
    if not path.is_file():
        raise IncompleteCheckpointError(
            f"Checkpoint {folder} is incomplete: {name} ({what}) is missing. Load a checkpoint saved with the same "
            "prepared objects."
        )
    return path


def _optimizer_path(folder: Path, index: int, formats: Sequence[EngineCheckpointFormat]) -> Path:
    if not (folder / layout.optimizer_file(index)).is_file():
        for fmt in formats:
            engine = fmt.folder(folder, index)
            if _engine_format(engine, (fmt,)) is not None:
                return engine
    return _require(folder, layout.optimizer_file(index), f"optimizer {index}", ShardedFormat.optimizer_folder(index))


def _engine_optimizer_state(strategy, fmt: EngineCheckpointFormat, path: Path, owner, optimizer) -> dict:
    """An engine checkpoint's optimizer state, rebuilt whole and laid out by this run's parameter positions."""
    if owner is None:
        raise CheckpointError(f"{path} keys the optimizer's state by parameter name, and the prepared "
                              f"{type(optimizer).__name__} trains no prepared model: prepare its model too.")
    named, param_groups = fmt.read_optimizer(path)
    return by_position(named, strategy.optimizer_parameter_names(owner, optimizer), param_groups)


def _count(folder: Path, name_of) -> int:
    count = 0
    while (folder / name_of(count)).is_file():
        count += 1
    return count


def _keyed_by_name(state) -> bool:
    return isinstance(state, dict) and isinstance(state.get("state"), dict) and bool(state["state"]) and all(
        isinstance(key, str) for key in state["state"])


def _weights_only(load_kwargs: Optional[dict]) -> bool:
    return bool((load_kwargs or {}).get("weights_only", True))


class _Plan:
    """Every file this process will read, found (or reported missing) before anything is loaded."""

    def __init__(self, targets: CheckpointTargets, folder: Path, marker: Optional[dict], models: list,
                 formats: Sequence[EngineCheckpointFormat]):
        state = PartialState()
        self.models = [model_path(folder, index, formats) for index in range(len(models))]
        self.optimizers = [_optimizer_path(folder, i, formats) for i in range(len(targets.optimizers))]
        self.schedulers = [_require(folder, layout.scheduler_file(i), f"scheduler {i}")
                           for i in range(len(targets.schedulers))]
        self.scaler = (_require(folder, layout.SCALER_NAME, "the fp16 gradient scaler")
                       if targets.scaler is not None else None)
        saved_custom = sorted(name for name in os.listdir(folder) if layout.is_custom_object_file(name))
        if len(saved_custom) != len(targets.custom_objects):
            raise IncompleteCheckpointError(
                f"Checkpoint {folder} holds {len(saved_custom)} registered object(s) but this run registered "
                f"{len(targets.custom_objects)} with register_for_checkpointing: register the same objects, in "
                "the same order, as the run that saved it."
            )
        self.custom = [_require(folder, layout.custom_object_file(i), f"registered object {i}")
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
            logger.warning("%s holds no random states of process %d: save_state was called on the main process only "
                           "(as diffusers' scripts do), so this process's random generators keep their current state, "
                           "as with the reference library.", folder, state.process_index)
        elif self.rng is None:
            if marker is not None:
                raise IncompleteCheckpointError(f"Checkpoint {folder} is incomplete: {rng.name} is missing.")
            logger.warning("%s has no %s: the random generators keep their current state.", folder, rng.name)
        if self.same_layout and self.loaders is None and targets.dataloaders:
            reference = [name for name in os.listdir(folder) if name.split(".")[0].rstrip("_0123456789")
                         in layout.REFERENCE_LOADER_NAMES]
            logger.warning(
                "%s has no data loader positions for this process (%s)%s: the prepared loaders start their current "
                "epoch from the beginning; resume mid-epoch with skip_first_batches.", folder, loaders.name,
                f"; the reference library's {', '.join(sorted(reference))} use(s) another format" if reference else "")
        extra = _count(folder, lambda i: layout.optimizer_file(i)) - len(self.optimizers)
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


def read_full_state(strategy, folder: Path, marker: Optional[dict], targets: CheckpointTargets,
                    load_kwargs: Optional[dict], device, strict: bool) -> LoadedState:
    """Read and check every file of ``folder`` this process needs; nothing is applied (see the module doc)."""
    models = targets.run_load_hooks(folder, strategy.unwrap)
    formats = tuple(getattr(strategy, "engine_checkpoint_formats", ()))
    plan = _Plan(targets, folder, marker, models, formats)
    for path in plan.models + plan.optimizers:  # an engine's own files (pickles): only when trusted
        fmt = _engine_format(path, formats)
        if fmt is not None:
            fmt.check_trusted(folder, marker, load_kwargs)
    loaded = LoadedState()
    for index, (model, path) in enumerate(zip(models, plan.models)):
        what = f"weights of model {index}"
        fmt = _engine_format(path, formats)
        if fmt is not None:
            state = fmt.read_weights(path)
        elif path.is_dir():
            state = model_weights_from_shards(path, weights_only=_weights_only(load_kwargs))
        elif path.suffix == ".safetensors":
            state = load_safetensors_file(path, what, device=device)
        else:
            state = load_pickle_file(path, what, map_location=device, load_kwargs=load_kwargs)
        if not isinstance(state, dict):
            raise CorruptCheckpointError(f"{path.name} in {folder} does not hold model weights (found a "
                                         f"{type(state).__name__}). Load another checkpoint.")
        state = prepare_loaded_state(strategy, model, state)
        _check_model(folder, path, strategy, model, state, strict)
        loaded.models.append((model, state))
    for index, (optimizer, path) in enumerate(zip(targets.optimizers, plan.optimizers)):
        fmt = _engine_format(path, formats)
        if fmt is not None:
            state = _engine_optimizer_state(strategy, fmt, path, targets.model_of(optimizer), optimizer)
        elif path.is_dir():
            owner = targets.model_of(optimizer)
            if owner is None:
                raise CheckpointError(f"{path} keys the optimizer's state by parameter name, and the prepared "
                                      f"{type(optimizer).__name__} trains no prepared model: prepare its model too.")
            state = optimizer_state_from_shards(path, strategy.optimizer_parameter_names(owner, optimizer),
                                                weights_only=_weights_only(load_kwargs))
        else:
            state = load_pickle_file(path, f"optimizer {index}", map_location=device, load_kwargs=load_kwargs)
            if _keyed_by_name(state):  # an FSDP optimizer state the reference library wrote (keyed by name)
                owner = targets.model_of(optimizer)
                if owner is None:
                    raise CheckpointError(f"{path.name} in {folder} keys the optimizer's state by parameter name, and "
                                          f"the prepared {type(optimizer).__name__} trains no prepared model.")
                state = by_position(state, strategy.optimizer_parameter_names(owner, optimizer), state["param_groups"])
        _check_optimizer(path, optimizer, state, strategy.optimizer_group_sizes(targets.model_of(optimizer), optimizer))
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


def apply_full_state(strategy, loaded: LoadedState, targets: CheckpointTargets, strict: bool) -> None:
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
