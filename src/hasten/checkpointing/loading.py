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

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from ..state import PartialState
from . import layout
from .agreement import from_main_process, gather_failures, gathered, together
from .atomic import (CONTENT_CHANGED, content_changed, process_markers, recover_interrupted_swap, start_content_check,
                     verify_complete)
from .contributions import verify_contribution
from .formats import is_checkpoint_file
from .errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError, IncompleteCheckpointError
from .rotation import checkpoints_root, complete_checkpoints, require_newest_complete_checkpoint

if TYPE_CHECKING:
    from ..config.project import ProjectConfiguration
    from ..core.aliases import Device
    from .strategy_protocol import CheckpointingStrategy
    from .targets import CheckpointTargets

__all__ = ["load_state", "load_newest", "resolve_load_folder", "agreed_folder", "complete_candidates"]

logger = logging.getLogger(__name__)

_MAP_LOCATIONS = (None, "cpu", "on_device")


def agreed_folder(pick: Callable[[], Union[str, os.PathLike]]) -> Path:
    """The main process runs ``pick()``; every process gets its folder, or raises its error."""
    state = PartialState()
    answer = [None, None]
    if state.is_main_process:
        try:
            answer[0] = str(pick())
        except CheckpointNotFoundError as error:
            answer[1] = str(error)
    from_main_process(answer)
    if answer[0] is None:
        raise CheckpointNotFoundError(answer[1])
    return Path(answer[0])


def resolve_load_folder(project_configuration: ProjectConfiguration,
                        input_dir: Optional[Union[str, os.PathLike]]) -> Path:
    """The folder to load: ``input_dir``, else the newest complete automatic checkpoint (collective)."""
    return _resolve_load_folder(project_configuration, input_dir)[0]


def _resolve_load_folder(project_configuration: ProjectConfiguration,
                         input_dir: Optional[Union[str, os.PathLike]]) -> tuple[Path, bool]:
    """``resolve_load_folder``, and whether some process loads a folder of its own (collective)."""
    if input_dir is not None:
        folder = Path(os.path.abspath(os.path.expanduser(os.fspath(input_dir))))

        def pick():
            recover_interrupted_swap(folder, is_checkpoint_file)
            if not folder.is_dir():
                raise CheckpointNotFoundError(f"Cannot load the state from {folder}: the folder does not exist.")
            return folder

        # One exchange: every process's folder, and the main process's after it checked it (or why it cannot).
        mine, failure = [str(folder), None], None
        if PartialState().is_main_process:
            try:
                pick()
            except Exception as error:  # noqa: BLE001 - raised below, once every process knows
                failure, mine[1] = error, (type(error).__name__, str(error))
        everyone = gathered(mine)
        agreed, outcome = Path(everyone[0][0]), everyone[0][1]
        if failure is not None:
            raise failure
        if outcome is not None:
            if outcome[0] == CheckpointNotFoundError.__name__:
                raise CheckpointNotFoundError(outcome[1])
            raise CheckpointError(f"finding the checkpoint folder failed on process 0 (so it stops here too): "
                                  f"{outcome[0]}: {outcome[1]}")
        if all(given == everyone[0][0] for given, _ in everyone):
            return agreed, False
        # A process given a folder other than the main process's loads its own (it saved a whole copy there).
        return together("finding the checkpoint folder", lambda: agreed if agreed == folder else Path(pick())), True
    if project_configuration.automatic_checkpoint_naming:
        root = checkpoints_root(project_configuration)
        return agreed_folder(lambda: require_newest_complete_checkpoint(root)), False
    raise ValueError(
        "load_state needs an input_dir, or automatic naming (ProjectConfiguration(project_dir=..., "
        "automatic_checkpoint_naming=True)) to load the newest checkpoint of the project."
    )


def _device_for(map_location, targets):
    if map_location not in _MAP_LOCATIONS:
        raise ValueError(f"map_location must be one of {_MAP_LOCATIONS}, got {map_location!r}.")
    if map_location == "on_device":
        return targets.device
    return "cpu"


# ----------------------------------------------------------------------------- one folder, or the newest good one
_DAMAGE = (CorruptCheckpointError.__name__, IncompleteCheckpointError.__name__)


class _Refused(Exception):
    """A folder every process checked, where at least one found a problem; ``damaged``: only damage (a
    corrupt or incomplete file), so an older checkpoint may be loaded instead."""

    def __init__(self, error: BaseException, damaged: bool, reason: str):
        super().__init__(reason)
        self.error, self.damaged, self.reason = error, damaged, reason


def _load_folder(strategy, targets, folder: Path, load_kwargs, device, strict: bool, own_folders: bool = False) -> None:
    """Check and read everything (the strategy's checkpoint IO), agree, apply; raises ``_Refused`` before
    anything is applied. The files' checksums are checked once in all, each process checking its share
    (``start_content_check``; all of its folder when ``own_folders``: the processes load different copies): a
    changed file found by any process refuses the load on every process."""
    error = loaded = None
    state = PartialState()
    try:
        marker = verify_complete(folder, check_content=False, process_index=state.process_index)
        verify_contribution(folder, marker, state.process_index)  # this process's own files, if it added any
        # in the background, while the files are parsed
        wait_for_checksums = start_content_check(folder, marker, share=(state.process_index, state.num_processes),
                                                 own_folder=own_folders or bool(process_markers(folder)))
        try:
            loaded = strategy.read_checkpoint(folder, marker, targets, load_kwargs=load_kwargs, device=device,
                                                 strict=strict)
        finally:
            mismatch = wait_for_checksums()
            if mismatch is not None:  # a changed file explains any parse error best
                raise content_changed(folder, *mismatch)
    except Exception as caught:  # noqa: BLE001 - every process learns of it below
        error = caught
    failures = gather_failures(error)
    if failures:
        changed = [failure for failure in failures if failure[1] == CorruptCheckpointError.__name__
                   and CONTENT_CHANGED in failure[2]]
        index, kind, text = (changed or failures)[0]
        if changed and not (isinstance(error, CorruptCheckpointError) and CONTENT_CHANGED in str(error)):
            # what another process found explains this one's error (if any) best
            error = CorruptCheckpointError(f"loading {folder} failed on process {index} (so it stops here too): "
                                           f"{text}")
        elif error is None:
            error = CheckpointError(f"loading {folder} failed on process {index} (so it stops here too): "
                                    f"{kind}: {text}")
        damaged = bool(changed) or all(kind in _DAMAGE for _, kind, _ in failures)
        raise _Refused(error, damaged, f"{kind}: {text}")
    together("loading the checkpoint", strategy.apply_checkpoint, loaded, targets, strict)


def complete_candidates(root: Union[str, os.PathLike]) -> list[Path]:
    """Collective: the complete checkpoints under ``root``, newest first, as the main process sees them."""
    state = PartialState()
    found = [None]
    if state.is_main_process:
        found[0] = [str(folder) for folder in complete_checkpoints(root)]
    from_main_process(found)
    return [Path(folder) for folder in found[0]]


def load_newest(strategy: CheckpointingStrategy, targets: CheckpointTargets, project: ProjectConfiguration,
                root: Union[str, os.PathLike], load_kwargs: Optional[dict] = None, device: Device = "cpu",
                strict: bool = True) -> Path:
    """Load the newest complete checkpoint under ``root`` that is intact; a damaged one is reported and the
    one before it tried. Raises ``CheckpointNotFoundError`` when there is none, the last error when none loads."""
    candidates = complete_candidates(root)
    if not candidates:
        agreed_folder(lambda: require_newest_complete_checkpoint(root))  # raises, saying what is there
    for position, folder in enumerate(candidates):
        try:
            _load_folder(strategy, targets, folder, load_kwargs, device, strict)
        except _Refused as refused:
            if not refused.damaged or position + 1 == len(candidates):
                raise refused.error from None
            logger.warning("The newest checkpoint %s is damaged and was not loaded (%s). Loading the previous "
                           "complete checkpoint, %s, instead.", folder, refused.reason, candidates[position + 1])
            continue
        if position:
            _skip_past(project, candidates[0])
        return folder
    raise AssertionError("unreachable")


def _skip_past(project, damaged: Path) -> None:
    """After falling back, the next automatic save must not land on the damaged folder's name."""
    iteration = layout.automatic_iteration(damaged)
    if iteration is not None and project.automatic_checkpoint_naming:
        project.iteration = max(project.iteration, iteration + 1)


def load_state(strategy: CheckpointingStrategy, targets: CheckpointTargets, project: ProjectConfiguration,
               input_dir: Optional[Union[str, os.PathLike]] = None, load_kwargs: Optional[dict] = None,
               _newest_under: Optional[Union[str, os.PathLike]] = None, **load_model_func_kwargs: Any) -> str:
    """Load a state saved by ``save_state`` (or by the reference library) into ``targets`` (a ``CheckpointTargets``)
    through ``strategy``; returns the folder loaded. ``project``: the ``ProjectConfiguration`` that names automatic
    folders. ``_newest_under`` (for ``auto_resume``): load the newest intact complete checkpoint under that folder."""
    map_location = load_model_func_kwargs.pop("map_location", None)
    strict = load_model_func_kwargs.pop("strict", True)
    if load_model_func_kwargs:
        raise TypeError(
            f"load_state got {sorted(load_model_func_kwargs)}: the model-loading options it takes are strict= and "
            "map_location= ('cpu' or 'on_device'); options for torch.load go in load_kwargs={...}."
        )
    if load_kwargs is not None and not isinstance(load_kwargs, dict):
        raise TypeError(f"load_kwargs must be a dict of torch.load options, got {type(load_kwargs).__name__}.")
    device = _device_for(map_location, targets)
    if _newest_under is not None or (input_dir is None and project.automatic_checkpoint_naming):
        root = Path(os.fspath(_newest_under)) if _newest_under is not None else checkpoints_root(project)
        folder = load_newest(strategy, targets, project, root, load_kwargs, device, strict)
        logger.info("Loaded the state from %s", folder)
    else:
        folder, own_folders = _resolve_load_folder(project, input_dir)
        logger.info("Loading the state from %s", folder)
        try:
            _load_folder(strategy, targets, folder, load_kwargs, device, strict, own_folders)
        except _Refused as refused:
            raise refused.error from None
    iteration = layout.automatic_iteration(folder)
    if project.automatic_checkpoint_naming and iteration is not None and project.project_dir is not None \
            and folder.parent.resolve() == checkpoints_root(project).resolve():
        project.iteration = max(project.iteration, iteration + 1)  # the next save must not overwrite it
    return str(folder)
