"""``load_state``: put a saved training state back into the prepared objects.

Before anything is loaded, the folder is checked: a hasten checkpoint must carry its completion marker and
every file it lists, with the saved sizes; for a folder another library wrote, every file this run needs
must exist. So a damaged or unfinished checkpoint fails with an error naming the file, and never leaves the
run half restored. Then, in order: load hooks, models, optimizers, schedulers, scaler, registered objects,
loader positions, random states, the accumulation step.

Files from a run with a different number of processes load, except the per-process parts (random states,
loader positions), which only make sense for the same layout: those are skipped with a warning.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

from ..state import PartialState
from ..utils.operations import broadcast_object_list
from . import layout
from .agreement import together
from .atomic import recover_interrupted_swap, verify_complete
from .errors import CheckpointNotFoundError, IncompleteCheckpointError
from .model_files import prepare_loaded_state
from .rng import restore_rng_states
from .rotation import checkpoints_root, require_newest_complete_checkpoint
from .safe_load import load_pickle_file, load_safetensors_file

__all__ = ["load_state", "resolve_load_folder", "agreed_folder"]

logger = logging.getLogger(__name__)

_MAP_LOCATIONS = (None, "cpu", "on_device")


def agreed_folder(pick) -> Path:
    """The main process runs ``pick()``; every process gets its folder, or raises its error."""
    state = PartialState()
    answer = [None, None]
    if state.is_main_process:
        try:
            answer[0] = str(pick())
        except CheckpointNotFoundError as error:
            answer[1] = str(error)
    if state.use_distributed:
        broadcast_object_list(answer)
    if answer[0] is None:
        raise CheckpointNotFoundError(answer[1])
    return Path(answer[0])


def resolve_load_folder(project_configuration, input_dir) -> Path:
    """The folder to load: ``input_dir``, else the newest complete automatic checkpoint (collective)."""
    if input_dir is not None:
        folder = Path(os.path.abspath(os.path.expanduser(os.fspath(input_dir))))

        def pick():
            recover_interrupted_swap(folder, layout.is_checkpoint_file)
            if not folder.is_dir():
                raise CheckpointNotFoundError(f"Cannot load the state from {folder}: the folder does not exist.")
            return folder

        agreed = agreed_folder(pick)
        # A process given a folder other than the main process's loads its own (it saved a whole copy there).
        return together("finding the checkpoint folder", lambda: agreed if agreed == folder else pick())
    if project_configuration.automatic_checkpoint_naming:
        root = checkpoints_root(project_configuration)
        return agreed_folder(lambda: require_newest_complete_checkpoint(root))
    raise ValueError(
        "load_state needs an input_dir, or automatic naming (ProjectConfiguration(project_dir=..., "
        "automatic_checkpoint_naming=True)) to load the newest checkpoint of the project."
    )


def _model_path(folder: Path, index: int) -> Path:
    safe = folder / layout.model_file(index, True)
    if safe.is_file():
        return safe
    pickled = folder / layout.model_file(index, False)
    if pickled.is_file():
        return pickled
    raise IncompleteCheckpointError(
        f"Checkpoint {folder} has no weights for model {index}: neither {safe.name} nor {pickled.name} exists. "
        "Load a checkpoint saved with the same prepared models."
    )


def _require(folder: Path, name: str, what: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise IncompleteCheckpointError(
            f"Checkpoint {folder} is incomplete: {name} ({what}) is missing. Load a checkpoint saved with the same "
            "prepared objects."
        )
    return path


def _count(folder: Path, name_of) -> int:
    count = 0
    while (folder / name_of(count)).is_file():
        count += 1
    return count


class _Plan:
    """Every file this process will read, found (or reported missing) before anything is loaded."""

    def __init__(self, accelerator, folder: Path, marker: Optional[dict], models: list):
        state = PartialState()
        self.models = [_model_path(folder, index) for index in range(len(models))]
        self.optimizers = [_require(folder, layout.optimizer_file(i), f"optimizer {i}")
                           for i in range(len(accelerator._optimizers))]
        self.schedulers = [_require(folder, layout.scheduler_file(i), f"scheduler {i}")
                           for i in range(len(accelerator._schedulers))]
        self.scaler = (_require(folder, layout.SCALER_NAME, "the fp16 gradient scaler")
                       if accelerator.scaler is not None else None)
        saved_custom = sorted(name for name in os.listdir(folder) if layout.is_custom_object_file(name))
        if len(saved_custom) != len(accelerator._custom_objects):
            raise IncompleteCheckpointError(
                f"Checkpoint {folder} holds {len(saved_custom)} registered object(s) but this run registered "
                f"{len(accelerator._custom_objects)} with register_for_checkpointing: register the same objects, in "
                "the same order, as the run that saved it."
            )
        self.custom = [_require(folder, layout.custom_object_file(i), f"registered object {i}")
                       for i in range(len(accelerator._custom_objects))]
        saved_processes = marker.get("num_processes") if marker else None
        self.same_layout = saved_processes in (None, state.num_processes)
        rng = folder / layout.rng_file(state.process_index)
        loaders = folder / layout.loader_states_file(state.process_index)
        self.rng = rng if self.same_layout and rng.is_file() else None
        self.loaders = loaders if self.same_layout and loaders.is_file() and accelerator._dataloaders else None
        if not self.same_layout:
            logger.warning(
                "%s was saved by %s processes and this run has %d: models, optimizers and schedulers are loaded, "
                "but random states and data loader positions are per process and are not restored: the loaders "
                "start from the beginning (continue mid-epoch with skip_first_batches).",
                folder, saved_processes, state.num_processes)
        elif self.rng is None:
            if marker is not None:
                raise IncompleteCheckpointError(f"Checkpoint {folder} is incomplete: {rng.name} is missing.")
            logger.warning("%s has no %s: the random generators keep their current state.", folder, rng.name)
        if self.same_layout and self.loaders is None and accelerator._dataloaders:
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


def _device_for(map_location, accelerator):
    if map_location not in _MAP_LOCATIONS:
        raise ValueError(f"map_location must be one of {_MAP_LOCATIONS}, got {map_location!r}.")
    if map_location == "on_device":
        return accelerator.device
    return "cpu"


def _load(accelerator, folder: Path, marker: Optional[dict], load_kwargs: Optional[dict], device, strict: bool):
    strategy = accelerator.strategy
    models = list(accelerator._models)
    for hook in list(accelerator._load_model_state_pre_hook.values()):
        hook(models, str(folder))
    plan = _Plan(accelerator, folder, marker, models)

    for index, (model, path) in enumerate(zip(models, plan.models)):
        what = f"weights of model {index}"
        loaded = (load_safetensors_file(path, what, device=device) if path.suffix == ".safetensors"
                  else load_pickle_file(path, what, map_location=device, load_kwargs=load_kwargs))
        strategy.load_model_state_dict(model, prepare_loaded_state(strategy, model, loaded), strict=strict)
    for index, (optimizer, path) in enumerate(zip(accelerator._optimizers, plan.optimizers)):
        state = load_pickle_file(path, f"optimizer {index}", map_location=device, load_kwargs=load_kwargs)
        strategy.load_optimizer_state_dict(optimizer, state)
    for index, (scheduler, path) in enumerate(zip(accelerator._schedulers, plan.schedulers)):
        scheduler.load_state_dict(load_pickle_file(path, f"scheduler {index}", load_kwargs=load_kwargs))
    if plan.scaler is not None:
        scaler_state = load_pickle_file(plan.scaler, "the gradient scaler", load_kwargs=load_kwargs)
        accelerator.scaler.load_state_dict(scaler_state)
    for index, (obj, path) in enumerate(zip(accelerator._custom_objects, plan.custom)):
        obj.load_state_dict(load_pickle_file(path, f"registered object {index}", map_location="cpu",
                                             load_kwargs=load_kwargs))
    if plan.loaders is not None:
        states = load_pickle_file(plan.loaders, "data loader positions", load_kwargs=load_kwargs)
        if len(states) != len(accelerator._dataloaders):
            logger.warning("%s holds positions for %d data loader(s), this run prepared %d: they are matched in the "
                           "order they were prepared.", folder, len(states), len(accelerator._dataloaders))
        for loader, state in zip(accelerator._dataloaders, states):
            if state is not None and callable(getattr(loader, "load_state_dict", None)):
                loader.load_state_dict(state)
    if plan.rng is not None:
        states = load_pickle_file(plan.rng, f"random states of process {PartialState().process_index}",
                                  load_kwargs=load_kwargs)
        restore_rng_states(states, source=str(plan.rng))
        if "step" in states:
            accelerator._accumulator.step = int(states["step"])


def load_state(accelerator, input_dir=None, load_kwargs: Optional[dict] = None, **load_model_func_kwargs) -> str:
    """Load a state saved by ``save_state`` (or by the reference library); returns the folder loaded."""
    map_location = load_model_func_kwargs.pop("map_location", None)
    strict = load_model_func_kwargs.pop("strict", True)
    if load_model_func_kwargs:
        raise TypeError(
            f"load_state got {sorted(load_model_func_kwargs)}: the model-loading options it takes are strict= and "
            "map_location= ('cpu' or 'on_device'); options for torch.load go in load_kwargs={...}."
        )
    if load_kwargs is not None and not isinstance(load_kwargs, dict):
        raise TypeError(f"load_kwargs must be a dict of torch.load options, got {type(load_kwargs).__name__}.")
    device = _device_for(map_location, accelerator)
    project = accelerator.project_configuration
    folder = resolve_load_folder(project, input_dir)
    logger.info("Loading the state from %s", folder)
    marker = together("checking the checkpoint", verify_complete, folder)
    together("loading the checkpoint", _load, accelerator, folder, marker, load_kwargs, device, strict)
    iteration = layout.automatic_iteration(folder)
    if project.automatic_checkpoint_naming and iteration is not None and project.project_dir is not None \
            and folder.parent.resolve() == checkpoints_root(project).resolve():
        project.iteration = max(project.iteration, iteration + 1)  # the next save must not overwrite it
    return str(folder)
