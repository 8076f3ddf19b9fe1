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
    adjust_scheduler: accepted as the reference accepts it; a prepared scheduler steps once per optimizer step either
        way (the reference's ``GradientState.adjust_scheduler`` reads it from ``to_kwargs``, which leaves the
        default ``True`` out, so it answers False unless set to False: hasten answers the same).
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
        """The options set to something other than their default, as the reference's kwargs handlers answer (what
        ``GradientState.plugin_kwargs`` holds)."""
        defaults = type(self)()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(defaults, f.name)}
