"""``GradientAccumulationPlugin``: how gradients are accumulated over several batches."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from .booleans import normalize_bool_fields

__all__ = ["GradientAccumulationPlugin"]


@dataclass
class GradientAccumulationPlugin:
    """Options of gradient accumulation.

    num_steps: batches per optimizer step (>= 1).
    adjust_scheduler: step a prepared scheduler once per optimizer step, not once per batch.
    sync_with_dataloader: the last batch of a loader always ends an accumulation cycle.
    sync_each_batch: synchronise gradients on every batch (less memory with DDP, slower).
    """

    num_steps: Optional[int] = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self):
        normalize_bool_fields(self)
        if self.num_steps is not None and (not isinstance(self.num_steps, int) or isinstance(self.num_steps, bool)
                                           or self.num_steps < 1):
            raise ValueError(f"num_steps (gradient accumulation steps) must be an int >= 1, got {self.num_steps!r}.")

    def to_kwargs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
