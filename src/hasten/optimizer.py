"""``AcceleratedOptimizer``: an optimizer that knows about gradient accumulation and fp16 loss scaling.

``step()`` and ``zero_grad()`` do nothing while gradients are being accumulated (between synchronising
batches), so a training loop can call them on every batch. With a ``GradScaler`` the step is taken through the
scaler, and ``step_was_skipped`` tells whether an fp16 overflow made it skip.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .core.aliases import Device, NestedData
from .state import GradientState, PartialState

__all__ = ["AcceleratedOptimizer", "move_to_device", "patch_optimizer_step"]


def move_to_device(state: NestedData, device: Device) -> NestedData:
    """``state`` (an optimizer state: nested dicts / lists / tuples of tensors) with every tensor moved to
    ``device``; containers keep their type, other values are returned as they are."""
    from .collectives.operations import _rebuild_mapping, honor_type

    if isinstance(state, (list, tuple)):
        return honor_type(state, (move_to_device(item, device) for item in state))
    if isinstance(state, dict):  # defaultdict (an optimizer's ``state``) included
        return _rebuild_mapping(state, {key: move_to_device(value, device) for key, value in state.items()})
    if isinstance(state, torch.Tensor):
        return state.to(device)
    return state


def patch_optimizer_step(accelerated_optimizer: AcceleratedOptimizer,
                         method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (an optimizer's ``step``) wrapped to record, as ``accelerated_optimizer._accelerate_step_called
    = True``, that it ran: a scaler that skips the step on fp16 overflow never calls it."""

    def patched_step(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched_step


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: Device) -> None:
    """Move the optimizer's per-parameter state tensors (e.g. Adam moments) to ``device``, in place.

    Scalar ``step`` counters stay where they are (on the CPU), as PyTorch's optimizers expect.
    """
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and not (key == "step" and value.dim() == 0):
                state[key] = value.to(device)


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer``; behaves like it everywhere (param_groups, state, state_dict ...).

    Parameters:
        optimizer: the optimizer to wrap.
        device_placement: move the optimizer's state to the process's device (and on ``load_state_dict``).
        scaler: a ``torch.amp.GradScaler`` for fp16 training; steps go through it.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device_placement: bool = True,
                 scaler: Optional[torch.amp.GradScaler] = None):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"AcceleratedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}.")
        self.optimizer = optimizer
        self.scaler = scaler
        self.device_placement = device_placement
        self.gradient_state = GradientState()
        self._is_overflow = False
        if device_placement and PartialState._shared_state:
            move_optimizer_state(self.optimizer, PartialState().device)

    # The wrapped optimizer's attributes, seen through the wrapper.
    @property
    def state(self) -> dict[Any, Any]:
        return self.optimizer.state

    @state.setter
    def state(self, value: dict[Any, Any]) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)
        if self.device_placement and PartialState._shared_state:
            move_optimizer_state(self.optimizer, PartialState().device)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients, except while accumulating."""
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Take the optimizer step when gradients are synchronised; a no-op while accumulating."""
        if not self.gradient_state.sync_gradients:
            self._is_overflow = False
            return None
        if self.scaler is None or not self.scaler.is_enabled():
            self._is_overflow = False
            return self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        scale_before = self.scaler.get_scale()
        result = self.scaler.step(self.optimizer, closure) if closure is not None else self.scaler.step(self.optimizer)
        self.scaler.update()
        # The scaler lowers its scale exactly when it found inf/NaN gradients and skipped the step.
        self._is_overflow = self.scaler.get_scale() < scale_before
        return result

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last ``step()`` was skipped because of an fp16 gradient overflow."""
        return self._is_overflow

    def train(self) -> None:
        """Switch schedule-free style optimizers to training mode (no-op for others)."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        """Switch schedule-free style optimizers to evaluation mode (no-op for others)."""
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "gradient_state"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.gradient_state = GradientState()

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"
