"""Gradient accumulation: deciding, batch by batch, whether this backward ends an accumulation cycle.

Gradients are synchronised (and the optimizer steps) every ``num_steps`` batches, and always on the last
batch of a data loader when ``sync_with_dataloader`` is on. Between those, DDP's ``no_sync`` keeps gradients
local so accumulation costs no communication (unless ``sync_each_batch``).
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, ContextManager, Sequence

from torch import nn

from .state import GradientState

if TYPE_CHECKING:
    from .strategies.base import Strategy

__all__ = ["GradientAccumulator"]


class GradientAccumulator:
    """Counts batches inside ``Accelerator.accumulate`` and sets ``GradientState.sync_gradients``."""

    def __init__(self, gradient_state: GradientState, strategy: Strategy, single_process: bool):
        self.gradient_state = gradient_state
        self.strategy = strategy
        self.single_process = single_process
        self.step = 0

    @property
    def num_steps(self) -> int:
        return self.gradient_state.num_steps

    def advance(self) -> None:
        """Count one more batch and decide whether its backward synchronises gradients."""
        self.step += 1
        at_boundary = self.step % self.num_steps == 0
        at_loader_end = self.gradient_state.end_of_dataloader and self.gradient_state.sync_with_dataloader
        self.gradient_state._set_sync_gradients(at_boundary or at_loader_end)
        if at_loader_end and not at_boundary:
            self.step = 0  # the next loader starts a fresh cycle

    def accumulate(self, models: Sequence[nn.Module]) -> ContextManager:
        """Count a batch; skip DDP's gradient synchronisation unless this batch ends a cycle (a context manager)."""
        self.advance()
        gradient_state = self.gradient_state
        if gradient_state.sync_gradients or gradient_state.sync_each_batch or self.single_process:
            return contextlib.nullcontext()  # the common step: nothing to enter
        stack = contextlib.ExitStack()
        for model in models:
            stack.enter_context(self.strategy.no_sync(model))
        return stack
