"""``save_state``: write everything a run needs to continue exactly, as one complete checkpoint folder.

Order: the strategy collects every state (``Strategy.collect_checkpoint``: a full-state ``Snapshot`` by
default), a folder is staged (``transaction.py``), the save hooks run, the strategy writes its files into the
staging folder (``Strategy.write_checkpoint``; ``layout.py`` names the default ones), the folder is completed
atomically (``atomic.py``: the marker lists the files of every process that took part), then, with automatic
naming, checkpoints beyond ``total_limit`` are deleted (``rotation.py``). The transaction is the same for every
strategy. Who takes part is settled first (``participation.py``): every process for sharded backends; under one
process per replica the main process alone, the others adding their own files afterwards (``contributions.py``).
"""
from __future__ import annotations

import errno
import logging
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from ..core.versions import HASTEN_VERSION
from ..state import PartialState
from .agreement import together
from .errors import CheckpointWriteError
from .contributions import add_process_files
from .participation import saves_apart, settle_participation
from .rotation import checkpoints_root, enforce_total_limit, next_automatic_folder, remove_stale_staging
from .transaction import SaveTransaction

if TYPE_CHECKING:
    from ..config.project import ProjectConfiguration
    from .strategy_protocol import CheckpointingStrategy
    from .targets import CheckpointTargets

__all__ = ["save_state", "resolve_save_folder"]

logger = logging.getLogger(__name__)


def resolve_save_folder(project_configuration: ProjectConfiguration,
                        output_dir: Optional[Union[str, os.PathLike]], must_be_new: bool = True) -> tuple[Path, bool]:
    """``(folder, automatic)``: where this save goes and whether it is an automatically named one. ``must_be_new``:
    an automatic folder must not exist yet (False for a process whose main process saves by itself and may have
    completed it already, ``participation.py``)."""
    if project_configuration.automatic_checkpoint_naming:
        if output_dir is not None:
            logger.warning("automatic_checkpoint_naming is on: output_dir=%r is ignored, the state goes to %s.",
                           output_dir, checkpoints_root(project_configuration))
        return next_automatic_folder(project_configuration, must_be_new), True
    if output_dir is None:
        raise ValueError(
            "save_state needs an output_dir, or automatic naming: "
            "Accelerator(project_config=ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True))."
        )
    folder = Path(os.path.abspath(os.path.expanduser(os.fspath(output_dir))))
    if folder.is_file():
        raise ValueError(f"Cannot save the state to {folder}: it is a file. Pass a folder path.")
    working = Path.cwd().resolve()
    if folder.exists() and (working == folder.resolve() or folder.resolve() in working.parents):
        raise ValueError(
            f"Cannot save the state to {folder}: the current working folder is inside it, and a save replaces "
            "the folder as a whole. Save to a sub-folder, e.g. save_state('checkpoint')."
        )
    return folder, False


def save_state(strategy: CheckpointingStrategy, targets: CheckpointTargets, project: ProjectConfiguration,
               output_dir: Optional[Union[str, os.PathLike]] = None, safe_serialization: bool = True,
               async_save: bool = False, **save_model_func_kwargs: Any) -> str:
    """Save a run's whole training state; returns the checkpoint folder (see ``Accelerator.save_state``).

    ``strategy`` writes the state inside the staging folder, ``targets`` (a ``CheckpointTargets``) is what is saved,
    ``project`` (a ``ProjectConfiguration``) names automatic folders and keeps the iteration. ``async_save``: write
    the files in the background (``async_save.py``). Called on the main process only (as diffusers' scripts do),
    the main process saves alone (``participation.py``)."""
    from . import async_save as background

    # the previous asynchronous save completes (or raises) before this one
    background.wait_for_pending("the next save_state")
    accepted = strategy.save_options_accepted
    unknown = sorted(set(save_model_func_kwargs) - set(accepted))
    if unknown:
        raise TypeError(
            f"save_state got {unknown}: extra model-saving options are passed to a backend's own checkpoint function "
            f"(DeepSpeed's save_checkpoint), and {type(strategy).__name__} takes "
            f"{sorted(accepted) if accepted else 'none'}."
        )
    if async_save and not strategy.supports_async_save:
        raise ValueError(f"save_state(async_save=True) is not available with {type(strategy).__name__}: its "
                         "engine writes its own files, collectively, while the save runs. Call save_state() without "
                         "async_save.")
    folder, automatic = resolve_save_folder(project, output_dir,
                                            must_be_new=PartialState().is_main_process or not saves_apart(strategy))
    participation = settle_participation(strategy, folder, project.save_on_each_node)
    if participation.skip:  # save_on_each_node: the main process saved this one alone, complete without this process
        project.iteration += 1
        return str(folder)
    if participation.contributes:  # the main process writes the checkpoint; this process adds its own files
        add_process_files(strategy, targets, folder, participation.handshake, async_save)
        project.iteration += 1
        return str(folder)
    handshake = participation.handshake
    try:
        return _write_checkpoint(strategy, targets, project, folder, automatic, participation, safe_serialization,
                                 async_save, save_model_func_kwargs)
    except BaseException as error:
        if handshake is not None:
            handshake.publish_outcome(None, error)  # the processes adding their files stop with an error too
        raise


def _write_checkpoint(strategy, targets, project, folder: Path, automatic: bool, participation, safe_serialization,
                      async_save: bool, save_model_func_kwargs: dict) -> str:
    """The checkpoint itself, by every process or by this one alone (``participation``): the same steps now or,
    with ``async_save``, in the background (``async_save.WriteNow`` / ``WriteInBackground``)."""
    from . import async_save as background

    processes = participation.processes  # None: every process
    handshake = participation.handshake
    save_id = uuid.uuid4().hex if handshake is not None else None
    if async_save and participation.alone and handshake is None:
        logger.info("save_state(async_save=True) on the main process alone writes synchronously (save_on_each_node).")
        async_save = False
    accepted = strategy.save_options_accepted
    hooks = bool(targets.save_hooks)
    writing = (background.WriteInBackground(every_process=processes is None, hooks=hooks) if async_save
               else background.WriteNow())
    options = dict(save_model_func_kwargs) if accepted else {}  # this save's, for the backend's IO
    snapshot = writing.take("collecting the state to save",
                            lambda: writing.copy(strategy.collect_checkpoint(targets, options), targets.optimizers,
                                                 models=targets.models),
                            processes)

    def prepare(view) -> SaveTransaction:
        """The folder staged, every step agreed on by ``view`` (``processes``, or the background's group)."""
        who = view or PartialState()
        if automatic:
            together("cleaning the checkpoints folder",
                     lambda: remove_stale_staging(folder.parent, saving=folder.name)
                     if (who.is_local_main_process if project.save_on_each_node else who.is_main_process) else None,
                     processes=view)
        transaction = SaveTransaction(folder, save_on_each_node=project.save_on_each_node, processes=view,
                                      own_folder=participation.own_folder)
        transaction.begin()
        logger.info("Saving the state to %s", folder)
        return transaction

    def run_hooks(staging: Path) -> None:
        targets.run_save_hooks(snapshot.weights, staging, strategy.unwrap)
        snapshot.recapture_rng()  # what the hooks drew counts: the run continues from here

    def write(transaction: SaveTransaction, staging: Path) -> None:
        try:
            strategy.write_checkpoint(staging, snapshot, writes_shared_files=transaction.writes_shared_files,
                                      process_index=PartialState().process_index,
                                      safe_serialization=safe_serialization, process_group=writing.group)
        except CheckpointWriteError as error:
            if error.errno == errno.ENOSPC and automatic and project.total_limit is not None:
                raise CheckpointWriteError(
                    f"{error} Here total_limit={project.total_limit}: the disk must hold "
                    f"{project.total_limit + 1} checkpoints while a save runs.", error.errno) from error
            raise

    metadata = {
        "library": "hasten", "version": HASTEN_VERSION, "num_processes": PartialState().num_processes,
        "step": int(snapshot.rng.get("step", 0)), "safe_serialization": bool(safe_serialization),
        "models": len(snapshot.weights), "optimizers": len(snapshot.optimizers),
        "schedulers": len(snapshot.schedulers), "custom_objects": len(snapshot.custom),
        "data_loaders": len(snapshot.loaders),
    }
    if save_id is not None:  # the other processes add their own files (contributions.py); loading says when not
        metadata.update(contributions=True, save_id=save_id)
    elif participation.alone:
        metadata["saved_alone"] = True  # save_on_each_node: the other processes' random states are not in it

    def complete(transaction: SaveTransaction) -> None:
        """Every process, once all wrote their files: the writer completes the checkpoint and applies
        ``total_limit``; the processes adding their own files hear the outcome."""
        if transaction.writes_shared_files:
            if handshake is not None:  # the processes adding their own files: incomplete without them
                metadata["expected_processes"] = handshake.announced()
            transaction._complete(metadata)
            if automatic:  # by every process that wrote a copy (one per machine without a shared file system)
                enforce_total_limit(folder.parent, project.total_limit, keep=folder)
        if handshake is not None:
            handshake.publish_outcome(save_id)

    def failed(error: BaseException) -> None:
        if handshake is not None:
            handshake.publish_outcome(None, error)  # the processes adding their own files stop with an error too

    writing.run(background.SaveSteps(folder, processes, prepare, run_hooks, write, complete, failed))
    project.iteration += 1
    return str(folder)
