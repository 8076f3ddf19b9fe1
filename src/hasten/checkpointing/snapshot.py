"""Everything a full-state checkpoint holds, taken from the ``CheckpointTargets`` before anything is written.

Model and optimizer states come from the strategy (each given its model); the rest from the prepared objects
themselves. Taking it all first means a failure (an object whose ``state_dict`` raises)
happens before the disk is touched, and the random states are those of the moment ``save_state`` was called.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .model_files import state_dict_for_checkpoint
from .rng import capture_rng_states

__all__ = ["Snapshot", "take_snapshot"]


@dataclass
class Snapshot:
    weights: list = field(default_factory=list)  # one state dict per model, keyed as the prepared model
    optimizers: list = field(default_factory=list)
    schedulers: list = field(default_factory=list)
    scaler: Optional[dict] = None
    loaders: list = field(default_factory=list)  # this process's loader states (None: a loader without one)
    custom: list = field(default_factory=list)
    rng: dict = field(default_factory=dict)


def _loader_state(loader) -> Optional[Any]:
    state_dict = getattr(loader, "state_dict", None)
    return state_dict() if callable(state_dict) else None


def take_snapshot(strategy, targets, model_state=None, optimizer_state=None) -> Snapshot:
    """Collective under sharded strategies (their state dicts gather): every process calls it.
    ``model_state(model)`` / ``optimizer_state(model, optimizer)``: how to take those states (default: the
    strategy's full state dicts)."""
    model_state = model_state or (lambda model: state_dict_for_checkpoint(strategy, model))
    optimizer_state = optimizer_state or strategy.optimizer_state_dict
    return Snapshot(
        weights=[model_state(model) for model in targets.models],
        optimizers=[optimizer_state(targets.model_of(optimizer), optimizer) for optimizer in targets.optimizers],
        schedulers=[scheduler.state_dict() for scheduler in targets.schedulers],
        scaler=targets.scaler.state_dict() if targets.scaler is not None else None,
        loaders=[_loader_state(loader) for loader in targets.dataloaders],
        custom=[obj.state_dict() for obj in targets.custom_objects],
        rng=capture_rng_states(step=targets.step),
    )
