"""``CheckpointTargets``: everything a checkpoint saves and restores, handed over by the Accelerator explicitly.

Checkpointing never reads the Accelerator's private attributes: the Accelerator builds one of these per
``save_state`` / ``load_state`` call, and the strategy's checkpoint IO reads and writes through it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

__all__ = ["CheckpointTargets"]


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

    def model_of(self, optimizer) -> Optional[torch.nn.Module]:
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
