"""Local SGD: each process takes optimizer steps on its own and the models are averaged every few steps.

Inside ``with LocalSGD(...)`` DDP does not all-reduce gradients on every backward; instead, every
``local_sgd_steps`` calls to ``step()`` (and when the block ends) the parameters are averaged across processes.
Fewer, larger synchronisations help on slow interconnects.
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional, Protocol

import torch
import torch.distributed as dist

__all__ = ["LocalSGD"]


class _PreparingAccelerator(Protocol):
    """What ``LocalSGD`` asks of the ``Accelerator`` (a room above this one: named by what it does, not imported)."""

    gradient_accumulation_steps: int
    use_distributed: bool

    def no_sync(self, model: torch.nn.Module) -> ContextManager[Any]: ...

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module: ...


class LocalSGD:
    """Context manager for Local SGD.

    Parameters:
        accelerator: the ``Accelerator`` that prepared ``model``.
        model: the prepared model.
        local_sgd_steps: optimizer steps between two parameter averages (>= 1).
        enabled: when False the block trains as usual (handy to switch it off by configuration).
    """

    def __init__(self, accelerator: _PreparingAccelerator, model: torch.nn.Module, local_sgd_steps: int,
                 enabled: bool = True):
        if not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps must be an int >= 1, got {local_sgd_steps!r}.")
        if enabled and accelerator.gradient_accumulation_steps > 1:
            raise ValueError("LocalSGD cannot be combined with gradient accumulation: set gradient_accumulation_steps "
                             "to 1, or raise local_sgd_steps instead.")
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.enabled = enabled and accelerator.use_distributed
        self.num_steps = 0
        self._stack = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._stack = contextlib.ExitStack()
            self._stack.enter_context(self.accelerator.no_sync(self.model))
        return self

    def __exit__(self, exc_type: Optional[type], exc_value: Optional[BaseException], traceback: Any) -> bool:
        if self.enabled:
            try:
                if exc_type is None:
                    self._average_parameters()
            finally:
                self._stack.close()
        return False

    def step(self) -> None:
        """Call after every optimizer step: averages the parameters every ``local_sgd_steps`` calls."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average_parameters()

    @torch.no_grad()
    def _average_parameters(self) -> None:
        world = dist.get_world_size()
        for parameter in self.accelerator.unwrap_model(self.model).parameters():
            dist.all_reduce(parameter.data, op=dist.ReduceOp.SUM)
            parameter.data.div_(world)
