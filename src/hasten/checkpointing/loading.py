"""``load_state``: put a saved training state back into the prepared objects, all of it or none of it.

1. Check the folder: a hasten checkpoint must carry its completion marker and every file it lists, with the
   saved sizes and checksums; for a folder another library wrote, every file this run needs must exist.
2. Run the load hooks, then read EVERY file into memory and check it against the live objects (model keys
   and shapes, optimizer parameter groups, the random states' fields).
3. Every process agrees that step 2 succeeded everywhere; only then is anything applied (optimizers,
   schedulers, scaler, registered objects, loader positions, random states and the accumulation step, the
   models last). If applying fails after all, what was already applied is put back as it was.

So a damaged, unfinished or refused checkpoint fails with an error naming the file, and leaves the run as
it was. Without a folder (automatic naming), and in ``auto_resume``, a newest checkpoint that turns out
damaged is reported and the previous complete one is loaded instead; a folder named explicitly still raises.

Files from a run with a different number of processes load, except the per-process parts (random states,
loader positions), which only make sense for the same layout: those are skipped with a warning.
"""
from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from ..state import PartialState
from ..utils.operations import broadcast_object_list
from . import layout
from .agreement import gather_failures, together
from .atomic import content_changed, recover_interrupted_swap, start_content_check, verify_complete
from .errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError, IncompleteCheckpointError
from .model_files import prepare_loaded_state
from .rng import capture_rng_states, restore_rng_states
from .rotation import checkpoints_root, complete_checkpoints, require_newest_complete_checkpoint
from .safe_load import load_pickle_file, load_safetensors_file

__all__ = ["load_state", "load_newest", "resolve_load_folder", "agreed_folder", "complete_candidates"]

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


# ----------------------------------------------------------------------------- 2. read and check everything
@dataclass
class _Loaded:
    """Every state this process will apply, read from the files and checked, nothing applied yet."""
    models: list = field(default_factory=list)
    optimizers: list = field(default_factory=list)
    schedulers: list = field(default_factory=list)
    scaler: object = None
    custom: list = field(default_factory=list)
    loaders: object = None
    rng: object = None


def _check_model(folder: Path, path: Path, strategy, model, state: dict, strict: bool) -> None:
    expected = strategy.unwrap(model).state_dict()
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


def _check_optimizer(path: Path, optimizer, state) -> None:
    if not isinstance(state, dict):
        raise CorruptCheckpointError(f"{path.name} in {path.parent} does not hold an optimizer state "
                                     f"(found a {type(state).__name__}). Load another checkpoint.")
    saved_groups = state.get("param_groups")
    live_groups = getattr(optimizer, "param_groups", None)
    if not isinstance(saved_groups, list) or not isinstance(live_groups, list):
        return  # a backend's own format: its load_state_dict checks it
    saved = [len(group.get("params", ())) if isinstance(group, dict) else None for group in saved_groups]
    live = [len(group["params"]) for group in live_groups]
    if saved != live:
        raise CheckpointError(
            f"{path.name} in {path.parent} was saved for an optimizer with parameter groups of sizes {saved}; the "
            f"prepared one has {live}. Nothing was loaded. Load a checkpoint of the same model and optimizer."
        )


def _check_dict(path: Path, what: str, state) -> None:
    if not isinstance(state, dict):
        raise CorruptCheckpointError(f"{path.name} in {path.parent} does not hold {what} (found a "
                                     f"{type(state).__name__}). Load another checkpoint.")


def _read(accelerator, folder: Path, marker: Optional[dict], load_kwargs: Optional[dict], device,
          strict: bool) -> _Loaded:
    strategy = accelerator.strategy
    models = list(accelerator._models)
    for hook in list(accelerator._load_model_state_pre_hook.values()):
        hook(models, str(folder))
    plan = _Plan(accelerator, folder, marker, models)
    loaded = _Loaded()
    for index, (model, path) in enumerate(zip(models, plan.models)):
        what = f"weights of model {index}"
        state = (load_safetensors_file(path, what, device=device) if path.suffix == ".safetensors"
                 else load_pickle_file(path, what, map_location=device, load_kwargs=load_kwargs))
        if not isinstance(state, dict):
            raise CorruptCheckpointError(f"{path.name} in {folder} does not hold model weights (found a "
                                         f"{type(state).__name__}). Load another checkpoint.")
        state = prepare_loaded_state(strategy, model, state)
        _check_model(folder, path, strategy, model, state, strict)
        loaded.models.append((model, state))
    for index, (optimizer, path) in enumerate(zip(accelerator._optimizers, plan.optimizers)):
        state = load_pickle_file(path, f"optimizer {index}", map_location=device, load_kwargs=load_kwargs)
        _check_optimizer(path, optimizer, state)
        loaded.optimizers.append((optimizer, state))
    for index, (scheduler, path) in enumerate(zip(accelerator._schedulers, plan.schedulers)):
        state = load_pickle_file(path, f"scheduler {index}", load_kwargs=load_kwargs)
        _check_dict(path, "a scheduler state", state)
        loaded.schedulers.append((scheduler, state))
    if plan.scaler is not None:
        loaded.scaler = load_pickle_file(plan.scaler, "the gradient scaler", load_kwargs=load_kwargs)
        _check_dict(plan.scaler, "a gradient scaler state", loaded.scaler)
    for index, (obj, path) in enumerate(zip(accelerator._custom_objects, plan.custom)):
        loaded.custom.append((obj, load_pickle_file(path, f"registered object {index}", map_location="cpu",
                                                    load_kwargs=load_kwargs)))
    if plan.loaders is not None:
        states = load_pickle_file(plan.loaders, "data loader positions", load_kwargs=load_kwargs)
        if not isinstance(states, (list, tuple)):
            raise CorruptCheckpointError(f"{plan.loaders.name} in {folder} does not hold data loader positions. "
                                         "Load another checkpoint.")
        if len(states) != len(accelerator._dataloaders):
            logger.warning("%s holds positions for %d data loader(s), this run prepared %d: they are matched in the "
                           "order they were prepared.", folder, len(states), len(accelerator._dataloaders))
        loaded.loaders = [(loader, state) for loader, state in zip(accelerator._dataloaders, states)
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


def _apply(accelerator, loaded: _Loaded, strict: bool) -> None:
    strategy = accelerator.strategy
    undo = []  # (function, argument) pairs that put back what was applied, run in reverse on failure
    try:
        for optimizer, state in loaded.optimizers:
            undo.append((lambda o, s: strategy.load_optimizer_state_dict(o, s), optimizer, optimizer.state_dict()))
            strategy.load_optimizer_state_dict(optimizer, state)
        for scheduler, state in loaded.schedulers:
            undo.append((lambda o, s: o.load_state_dict(s), scheduler, _copy(scheduler.state_dict())))
            scheduler.load_state_dict(state)
        if loaded.scaler is not None:
            undo.append((lambda o, s: o.load_state_dict(s), accelerator.scaler, _copy(accelerator.scaler.state_dict())))
            accelerator.scaler.load_state_dict(loaded.scaler)
        for obj, state in loaded.custom:
            undo.append((lambda o, s: o.load_state_dict(s), obj, _copy(obj.state_dict())))
            obj.load_state_dict(state)
        for loader, state in loaded.loaders or ():
            current = loader.state_dict() if callable(getattr(loader, "state_dict", None)) else None
            if current is not None:
                undo.append((lambda o, s: o.load_state_dict(s), loader, _copy(current)))
            loader.load_state_dict(state)
        if loaded.rng is not None:
            states, source = loaded.rng
            step = accelerator._accumulator.step
            undo.append((lambda o, s: (restore_rng_states(s), setattr(accelerator._accumulator, "step", o)),
                         step, capture_rng_states()))
            restore_rng_states(states, source=source)
            if "step" in states:
                accelerator._accumulator.step = int(states["step"])
        for model, state in loaded.models:  # last: a model's weights cannot be put back without a copy
            strategy.load_model_state_dict(model, state, strict=strict)
    except BaseException:
        for function, target, previous in reversed(undo):
            try:
                function(target, previous)
            except Exception:  # noqa: BLE001 - keep putting back the others; the original error is raised
                logger.exception("Could not put back the state of %r after a failed load.", target)
        raise


# ----------------------------------------------------------------------------- one folder, or the newest good one
_DAMAGE = (CorruptCheckpointError.__name__, IncompleteCheckpointError.__name__)


class _Refused(Exception):
    """A folder every process checked, where at least one found a problem; ``damaged``: only damage (a
    corrupt or incomplete file), so an older checkpoint may be loaded instead."""

    def __init__(self, error: BaseException, damaged: bool, reason: str):
        super().__init__(reason)
        self.error, self.damaged, self.reason = error, damaged, reason


def _load_folder(accelerator, folder: Path, load_kwargs, device, strict: bool) -> None:
    """Check and read everything, agree, apply; raises ``_Refused`` before anything is applied."""
    error = loaded = None
    try:
        marker = verify_complete(folder, check_content=False)
        wait_for_checksums = start_content_check(folder, marker)  # in the background, while the files are parsed
        try:
            loaded = _read(accelerator, folder, marker, load_kwargs, device, strict)
        finally:
            mismatch = wait_for_checksums()
            if mismatch is not None:  # a changed file explains any parse error best
                raise content_changed(folder, *mismatch)
    except Exception as caught:  # noqa: BLE001 - every process learns of it below
        error = caught
    failures = gather_failures(error)
    if failures:
        index, kind, text = failures[0]
        if error is None:
            error = CheckpointError(f"loading {folder} failed on process {index} (so it stops here too): "
                                    f"{kind}: {text}")
        raise _Refused(error, all(kind in _DAMAGE for _, kind, _ in failures), f"{kind}: {text}")
    together("loading the checkpoint", _apply, accelerator, loaded, strict)


def complete_candidates(root) -> list[Path]:
    """Collective: the complete checkpoints under ``root``, newest first, as the main process sees them."""
    state = PartialState()
    found = [None]
    if state.is_main_process:
        found[0] = [str(folder) for folder in complete_checkpoints(root)]
    if state.use_distributed:
        broadcast_object_list(found)
    return [Path(folder) for folder in found[0]]


def load_newest(accelerator, root, load_kwargs: Optional[dict] = None, device="cpu", strict: bool = True) -> Path:
    """Load the newest complete checkpoint under ``root`` that is intact; a damaged one is reported and the
    one before it tried. Raises ``CheckpointNotFoundError`` when there is none, the last error when none loads."""
    candidates = complete_candidates(root)
    if not candidates:
        agreed_folder(lambda: require_newest_complete_checkpoint(root))  # raises, saying what is there
    for position, folder in enumerate(candidates):
        try:
            _load_folder(accelerator, folder, load_kwargs, device, strict)
        except _Refused as refused:
            if not refused.damaged or position + 1 == len(candidates):
                raise refused.error from None
            logger.warning("The newest checkpoint %s is damaged and was not loaded (%s). Loading the previous "
                           "complete checkpoint, %s, instead.", folder, refused.reason, candidates[position + 1])
            continue
        if position:
            _skip_past(accelerator.project_configuration, candidates[0])
        return folder
    raise AssertionError("unreachable")


def _skip_past(project, damaged: Path) -> None:
    """After falling back, the next automatic save must not land on the damaged folder's name."""
    iteration = layout.automatic_iteration(damaged)
    if iteration is not None and project.automatic_checkpoint_naming:
        project.iteration = max(project.iteration, iteration + 1)


def load_state(accelerator, input_dir=None, load_kwargs: Optional[dict] = None, _newest_under=None,
               **load_model_func_kwargs) -> str:
    """Load a state saved by ``save_state`` (or by the reference library); returns the folder loaded.
    ``_newest_under`` (for ``auto_resume``): load the newest intact complete checkpoint under that folder."""
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
    if _newest_under is not None or (input_dir is None and project.automatic_checkpoint_naming):
        root = Path(os.fspath(_newest_under)) if _newest_under is not None else checkpoints_root(project)
        folder = load_newest(accelerator, root, load_kwargs, device, strict)
        logger.info("Loaded the state from %s", folder)
    else:
        folder = resolve_load_folder(project, input_dir)
        logger.info("Loading the state from %s", folder)
        try:
            _load_folder(accelerator, folder, load_kwargs, device, strict)
        except _Refused as refused:
            raise refused.error from None
    iteration = layout.automatic_iteration(folder)
    if project.automatic_checkpoint_naming and iteration is not None and project.project_dir is not None \
            and folder.parent.resolve() == checkpoints_root(project).resolve():
        project.iteration = max(project.iteration, iteration + 1)  # the next save must not overwrite it
    return str(folder)
