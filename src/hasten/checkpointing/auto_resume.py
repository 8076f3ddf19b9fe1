"""Continuing automatically after a crash: one line at the start of the training script.

    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir="run", automatic_checkpoint_naming=True))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    auto_resume(accelerator)   # fresh start: does nothing; after a restart: loads the newest complete checkpoint

Launched with ``hasten launch --max_restarts N``, a job whose process dies is restarted from the top of the
script; this line then finds the newest checkpoint whose save completed (a save the crash interrupted is
skipped) and restores everything, including each loader's position, so the loop continues where that
checkpoint was taken. A newest checkpoint that turns out damaged (a file whose checksum no longer matches,
one that cannot be read) is reported and the previous complete one is loaded instead, so a damaged
checkpoint does not fail every restart.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol, Union

from .errors import CheckpointNotFoundError
from .loading import agreed_folder
from .rotation import checkpoints_root, newest_complete_checkpoint

if TYPE_CHECKING:
    from ..config.project import ProjectConfiguration
    from .strategy_protocol import CheckpointingStrategy
    from .targets import CheckpointTargets

__all__ = ["auto_resume", "latest_checkpoint"]

logger = logging.getLogger(__name__)


class _ResumingAccelerator(Protocol):
    """What ``auto_resume`` asks of the ``Accelerator`` (a room above this one: named by what it does, not imported)."""

    @property
    def project_configuration(self) -> ProjectConfiguration: ...

    @property
    def strategy(self) -> CheckpointingStrategy: ...

    def wait_for_checkpoint(self) -> Optional[str]: ...

    def checkpoint_targets(self) -> CheckpointTargets: ...


def latest_checkpoint(accelerator: _ResumingAccelerator,
                      checkpoints_dir: Optional[Union[str, os.PathLike]] = None) -> Optional[str]:
    """The newest complete checkpoint of the project (or under ``checkpoints_dir``), or None (collective)."""
    root = Path(os.fspath(checkpoints_dir)) if checkpoints_dir is not None \
        else checkpoints_root(accelerator.project_configuration)

    def pick():
        folder = newest_complete_checkpoint(root)
        if folder is None:
            raise CheckpointNotFoundError("none")
        return folder

    try:
        return str(agreed_folder(pick))
    except CheckpointNotFoundError:
        return None


def auto_resume(accelerator: _ResumingAccelerator, checkpoints_dir: Optional[Union[str, os.PathLike]] = None,
                **load_state_kwargs: Any) -> Optional[str]:
    """Load the newest complete checkpoint if there is one; returns its folder, or None on a fresh start.

    ``checkpoints_dir`` defaults to ``{project_dir}/checkpoints`` (automatic naming). Call it on every process,
    after ``prepare`` and ``register_for_checkpointing``. ``load_state_kwargs`` go to ``load_state``.
    """
    if checkpoints_dir is None and not accelerator.project_configuration.automatic_checkpoint_naming:
        raise ValueError(
            "auto_resume looks for the project's automatically named checkpoints: create the Accelerator with "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True), or pass checkpoints_dir=..."
        )
    folder = latest_checkpoint(accelerator, checkpoints_dir)
    if folder is None:
        logger.info("auto_resume: no complete checkpoint yet, starting from scratch.")
        return None
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    note = f" (restart {restart})" if restart not in (None, "0") else ""
    from .loading import load_state

    root = Path(os.fspath(checkpoints_dir)) if checkpoints_dir is not None \
        else checkpoints_root(accelerator.project_configuration)
    accelerator.wait_for_checkpoint()  # a pending save_state(async_save=True) completes first
    loaded = load_state(accelerator.strategy, accelerator.checkpoint_targets(), accelerator.project_configuration,
                        None, _newest_under=root, **load_state_kwargs)
    logger.warning("auto_resume: continuing from %s%s.", loaded, note)
    return loaded
