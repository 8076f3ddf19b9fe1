"""The strategy protocol: everything that differs between training backends, behind one small interface.

The ``Accelerator`` composes a strategy with the shared rooms (precision, data, checkpointing) and never
branches on the backend itself. Adding a backend (FSDP, DeepSpeed ...) means adding one file here.

A strategy prepares models *together with* their optimizers (``prepare_training``): some backends build one
engine from both (DeepSpeed) or replace the parameters an optimizer points at (FSDP2), so preparing them one
at a time is not enough in general.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager, Iterable, Optional, Sequence

import torch
from torch import nn

from ..config.enums import DistributedType
from ..utils.modeling import extract_model_from_parallel


class Strategy:
    """Base strategy: one process, plain ``nn.Module``; subclasses override what their backend changes."""

    #: the DistributedType this strategy implements
    distributed_type: DistributedType = DistributedType.NO

    def __init__(self, state, kwargs_handlers: Optional[dict] = None):
        self.state = state
        self.handlers = kwargs_handlers or {}

    # ------------------------------------------------------------ set-up and preparation
    def setup(self) -> None:
        """Create what the backend needs before anything is prepared (process groups, meshes)."""

    def prepare_training(self, models: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
                         device_placement: Sequence[bool], evaluation_mode: bool = False):
        """Prepare models and the optimizers that train them, together. Returns ``(models, optimizers)``.

        The default prepares each model with ``prepare_model`` and each optimizer with ``prepare_optimizer``.
        """
        prepared = [self.prepare_model(m, place, evaluation_mode) for m, place in zip(models, device_placement)]
        return prepared, [self.prepare_optimizer(o) for o in optimizers]

    def prepare_model(self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False):
        """Place (and for distributed backends, wrap) one model."""
        if device_placement:
            model = model.to(self.state.device)
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    # ------------------------------------------------------------ the training step
    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        loss.backward(**kwargs)

    def no_sync(self, model: nn.Module) -> ContextManager:
        """A context in which gradients are accumulated locally, without being synchronised."""
        return contextlib.nullcontext()

    def trigger_sync_in_backward(self, model: nn.Module) -> ContextManager:
        """A context in which the next backward synchronises gradients even inside ``no_sync``."""
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # ------------------------------------------------------------ state dicts (checkpointing asks the strategy)
    def model_state_dict(self, model: nn.Module, full: bool = True) -> dict:
        return self.unwrap(model).state_dict()

    def load_model_state_dict(self, model: nn.Module, state_dict: dict, strict: bool = True):
        return self.unwrap(model).load_state_dict(state_dict, strict=strict)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict:
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
        optimizer.load_state_dict(state_dict)

    # ------------------------------------------------------------ unwrapping
    def unwrap(self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> nn.Module:
        return extract_model_from_parallel(model, keep_fp32_wrapper=keep_fp32_wrapper,
                                           keep_torch_compile=keep_torch_compile)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.state.device}, processes={self.state.num_processes})"
