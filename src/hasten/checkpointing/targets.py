"""``CheckpointTargets``: everything a checkpoint saves and restores, handed over by the Accelerator explicitly,
and the check of the objects given to ``register_for_checkpointing`` (anything with ``state_dict()`` and
``load_state_dict()``).

Checkpointing never reads the Accelerator's private attributes: the Accelerator builds one of these per
``save_state`` / ``load_state`` call, and the strategy's checkpoint IO reads and writes through it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union

import torch

if TYPE_CHECKING:
    from torch.distributed.checkpoint.stateful import Stateful
    from torch.utils.data import DataLoader


__all__ = ["CheckpointTargets", "check_registrable", "loader_state"]


def loader_state(loader: DataLoader) -> Optional[Any]:
    """What a checkpoint keeps of a data loader: hasten's full position (``resume_state_dict()``: epoch counter
    and generators included; a stateful loader's ``state_dict()`` is torchdata's alone), else the loader's
    ``state_dict()``, else None (a loader with no state)."""
    for name in ("resume_state_dict", "state_dict"):
        method = getattr(loader, name, None)
        if callable(method):
            return method()
    return None


@dataclass
class CheckpointTargets:
    """The prepared objects of a run, in the order they were prepared (file names follow that order).

    ``step`` / ``set_step``: the gradient-accumulation step, read when saving and put back when loading.
    ``save_hooks`` / ``load_hooks``: the registered ``save_state`` / ``load_state`` pre-hooks, in order.
    ``device``: where ``map_location="on_device"`` puts loaded tensors.
    """

    models: list = field(default_factory=list)
    optimizers: list = field(default_factory=list)
    schedulers: list = field(default_factory=list)
    dataloaders: list = field(default_factory=list)
    scaler: Any = None
    custom_objects: list = field(default_factory=list)
    step: int = 0
    set_step: Callable[[int], None] = lambda step: None
    save_hooks: list = field(default_factory=list)
    load_hooks: list = field(default_factory=list)
    device: Optional[torch.device] = None

    def run_save_hooks(self, weights: list, folder: Union[str, os.PathLike],
                       unwrap: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
        """The ``save_state`` pre-hooks, in order, given the models unwrapped by ``unwrap`` (the reference gives them
        so; diffusers' hooks call ``save_pretrained`` on them), ``weights`` (remove one to skip saving it) and the
        folder being written."""
        models = [unwrap(model) for model in self.models]
        for hook in list(self.save_hooks):
            hook(models, weights, str(folder))

    def run_load_hooks(self, folder: Union[str, os.PathLike],
                       unwrap: Callable[[torch.nn.Module], torch.nn.Module]) -> list[torch.nn.Module]:
        """The ``load_state`` pre-hooks, in order, given the unwrapped models; returns the prepared models still in
        the list afterwards (a hook removes a model to load it itself)."""
        unwrapped = [unwrap(model) for model in self.models]
        remaining = list(unwrapped)
        for hook in list(self.load_hooks):
            hook(remaining, str(folder))
        return [model for model, plain in zip(self.models, unwrapped) if any(plain is kept for kept in remaining)]

    def model_of(self, optimizer: torch.optim.Optimizer) -> Optional[torch.nn.Module]:
        """The prepared model whose parameters ``optimizer`` trains (None when it trains none of them).

        Sharded backends need the model to produce or load an optimizer's state (``get_optimizer_state_dict``).
        """
        engine = getattr(optimizer, "engine", None)  # DeepSpeed's prepared optimizer: its engine is the model
        if engine is not None and any(model is engine for model in self.models):
            return engine
        inner = getattr(optimizer, "optimizer", optimizer)
        params = {id(p) for group in inner.param_groups for p in group["params"]}
        for model in self.models:
            if any(id(p) in params for p in model.parameters()):
                return model
        return None




def _describe(obj) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__


def check_registrable(objects: Iterable[Any]) -> list[Stateful]:
    """``objects`` as a list, or ValueError naming every one that lacks ``state_dict`` / ``load_state_dict``."""
    invalid = []
    for position, obj in enumerate(objects):
        missing = [name for name in ("state_dict", "load_state_dict") if not callable(getattr(obj, name, None))]
        if missing:
            invalid.append(f"Item at index {position} ({_describe(obj)}) has no {' and no '.join(missing)}")
    if invalid:
        raise ValueError(
            "register_for_checkpointing takes objects with state_dict() and load_state_dict() methods (their "
            "state is saved and restored with the checkpoint); " + "; ".join(invalid) + ". Wrap such a value in a "
            "small class with those two methods."
        )
    return list(objects)
