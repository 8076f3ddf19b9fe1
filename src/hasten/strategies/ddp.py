"""Data parallelism with ``torch.nn.parallel.DistributedDataParallel`` (gloo on CPU, nccl on CUDA)."""
from __future__ import annotations

import contextlib
from typing import ContextManager, Iterator

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..config.enums import DistributedType
from ..config.kwargs import DistributedDataParallelKwargs
from .base import Strategy


class DDPStrategy(Strategy):
    """Every process holds the whole model; DDP averages gradients during ``backward``."""

    @property
    def distributed_type(self) -> DistributedType:
        return self.processes.distributed_type

    @property
    def ddp_kwargs(self) -> DistributedDataParallelKwargs:
        return self.handlers.get(DistributedDataParallelKwargs) or DistributedDataParallelKwargs()

    def prepare_model(self, model: nn.Module, device_placement: bool = True,
                      evaluation_mode: bool = False) -> nn.Module:
        model = super().prepare_model(model, device_placement, evaluation_mode)
        if evaluation_mode or isinstance(model, DistributedDataParallel):
            return model
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise: DDP refuses such models
        device_ids = None
        if self.processes.device.type not in ("cpu", "mps"):
            device_ids = [self.processes.device.index if self.processes.device.index is not None else 0]
        handler = self.ddp_kwargs
        wrapped = DistributedDataParallel(model, device_ids=device_ids, **handler.to_kwargs())
        handler.register_comm_hook(wrapped)
        return wrapped

    def no_sync(self, model: nn.Module) -> ContextManager:
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        saved = (model.require_backward_grad_sync, model.require_forward_param_sync)
        model.require_backward_grad_sync = True
        model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])  # the next backward all-reduces
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = saved
