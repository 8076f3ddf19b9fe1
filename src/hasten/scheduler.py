"""``AcceleratedScheduler``: a learning-rate scheduler that steps only when the optimizer really stepped.

With ``split_batches=False`` every process consumes its own batch, so one optimizer step sees
``num_processes`` batches: the scheduler is then advanced ``num_processes`` times per optimizer step, so that
a schedule written in single-process steps (e.g. warm-up over 1000 batches) keeps its meaning. This matches
the reference library; ``Accelerator.prepare`` says so in the log once, because it surprises people.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Union

from .state import GradientState, PartialState

if TYPE_CHECKING:
    import torch

__all__ = ["AcceleratedScheduler"]


class AcceleratedScheduler:
    """Wraps ``scheduler`` (a ``torch.optim.lr_scheduler.LRScheduler`` or anything with ``step()``).

    Parameters:
        scheduler: the scheduler to wrap.
        optimizers: the (prepared) optimizer or optimizers it schedules.
        step_with_optimizer: step only when the optimizers stepped (not while accumulating, not after an
            fp16 overflow skip).
        split_batches: whether loaders split each batch across processes (then one scheduler step per
            optimizer step) or give each process whole batches (``num_processes`` scheduler steps).
    """

    def __init__(self, scheduler: Any, optimizers: Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]],
                 step_with_optimizer: bool = True, split_batches: bool = False):
        if not hasattr(scheduler, "step"):
            raise TypeError(f"AcceleratedScheduler wraps a learning-rate scheduler, got {type(scheduler).__name__}.")
        self.scheduler = scheduler
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer
        self.gradient_state = GradientState()
        #: the processes that each consume their own batch per step (the Accelerator sets it to the data-parallel
        #: size: the ranks of one tensor-parallel group share a batch); None: every process
        self.data_parallel_size = None

    def _num_processes(self) -> int:
        if self.data_parallel_size is not None:
            return self.data_parallel_size
        return PartialState().num_processes if PartialState._shared_state else 1  # a process fact

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                # keep torch's "optimizer.step() before lr_scheduler.step()" bookkeeping quiet
                self.scheduler._step_count = getattr(self.scheduler, "_step_count", 0) + 1
            return
        if any(getattr(opt, "step_was_skipped", False) for opt in self.optimizers):
            return
        repeats = 1 if self.split_batches else self._num_processes()
        # OneCycleLR refuses to step past its end. Its position is last_epoch: _step_count (which the reference
        # checks) also counts the accumulation steps above, and would stop the schedule a third of the way early.
        total = getattr(self.scheduler, "total_steps", None)
        for _ in range(repeats):
            if total is not None and self.scheduler.last_epoch >= total:
                break
            self.scheduler.step(*args, **kwargs)

    # Everything else is the wrapped scheduler's.
    def get_last_lr(self) -> list:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> list:
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name):
        if name in ("scheduler", "__setstate__", "__getstate__"):
            raise AttributeError(name)
        return getattr(self.scheduler, name)
