"""Ray Train: report an ``Accelerator``'s whole state as a Ray checkpoint, and resume from the one Ray hands back.

Inside a ``TorchTrainer``'s ``train_func`` (Ray starts the workers and forms the process group; hasten joins it)::

    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)
    resume(accelerator)                      # the newest checkpoint Ray registered, if any
    for epoch in ...:
        ...
        report(accelerator, {"loss": loss.item()})

``report`` saves the state into a temporary folder of this process and reports it with the metrics; every rank
must call it (Ray's ``report`` waits for all of them). Ray copies every rank's folder into one checkpoint folder;
hasten's folders are made to be merged that way (checkpointing/transaction.py: every file name belongs to one rank or
holds the same bytes in every folder), so the checkpoint restores every process, random states included. ``resume``
loads ``ray.train.get_checkpoint()`` with ``load_state``, all or nothing, as any checkpoint. After a worker fails,
``FailureConfig(max_failures=...)`` makes Ray restart the whole group, and ``resume`` continues from the last
checkpoint it registered.
"""
from __future__ import annotations

import tempfile
from typing import Any, Optional

from ..core.imports import require_extra

__all__ = ["report", "resume"]


def _ray_train():
    return require_extra("ray.train", "hasten's Ray Train integration")


def report(accelerator: Any, metrics: dict, **save_state_kwargs: Any) -> None:
    """Save ``accelerator``'s state into a temporary folder of this process and report it to Ray Train with
    ``metrics`` (``ray.train.report``); the folder is removed once Ray has copied it. Call it on every rank.
    ``save_state_kwargs`` go to ``save_state`` (``safe_serialization``, ...)."""
    ray_train = _ray_train()
    if accelerator.project_configuration.automatic_checkpoint_naming:
        raise ValueError("hasten.integrations.ray.report saves into a folder that Ray copies and names; automatic "
                         "checkpoint naming would save into the project folder instead. Turn it off, and keep as "
                         "many checkpoints as you want with Ray's CheckpointConfig(num_to_keep=...).")
    with tempfile.TemporaryDirectory(prefix="hasten-ray-checkpoint-") as folder:
        accelerator.save_state(folder, **save_state_kwargs)
        ray_train.report(metrics, checkpoint=ray_train.Checkpoint.from_directory(folder))


def resume(accelerator: Any, **load_state_kwargs: Any) -> Optional[str]:
    """Load the newest checkpoint Ray Train registered for this run (``ray.train.get_checkpoint()``) into
    ``accelerator``'s prepared objects; returns its path, or None when there is none yet (a first start).
    ``load_state_kwargs`` go to ``load_state``. Call it on every rank."""
    checkpoint = _ray_train().get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        accelerator.load_state(folder, **load_state_kwargs)
    return str(checkpoint.path)
