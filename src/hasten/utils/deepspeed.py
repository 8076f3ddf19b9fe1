"""Accelerate's ``accelerate.utils.deepspeed`` names. DeepSpeed training is planned, not built yet.

What needs no DeepSpeed works now: ``HfDeepSpeedConfig`` (reading and querying a DeepSpeed config),
``DummyOptim`` / ``DummyScheduler`` (placeholders for an optimizer / scheduler defined in the DeepSpeed config) and
``get_active_deepspeed_plugin``. The engine wrappers and ``map_pytorch_optim_to_deepspeed`` raise
``NotYetSupportedError``. deepspeed is never imported.
"""
from __future__ import annotations

from ..config.deepspeed import HfDeepSpeedConfig
from ..config.enums import DistributedType
from ..optimizer import AcceleratedOptimizer
from ..scheduler import AcceleratedScheduler
from .planned import not_yet_supported

__all__ = [
    "map_pytorch_optim_to_deepspeed", "get_active_deepspeed_plugin", "HfDeepSpeedConfig", "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper", "DummyOptim", "DummyScheduler",
]

_MEANWHILE = "train with DDP (several processes) or on a single device"


def _deepspeed(what: str):
    return not_yet_supported(f"DeepSpeed ({what})", _MEANWHILE)


def map_pytorch_optim_to_deepspeed(optimizer):
    """DeepSpeed's CPU-offload version of ``optimizer`` (DeepSpeedCPUAdam, ...): planned."""
    raise _deepspeed("map_pytorch_optim_to_deepspeed")


def get_active_deepspeed_plugin(state):
    """The ``DeepSpeedPlugin`` in use; a ``ValueError`` when the run does not use DeepSpeed."""
    if state.distributed_type != DistributedType.DEEPSPEED:
        raise ValueError("No DeepSpeedPlugin is active: this run does not use DeepSpeed.")
    plugins = state.deepspeed_plugins
    if not isinstance(plugins, dict):
        return plugins
    return next(plugin for plugin in plugins.values() if plugin.selected)


class DeepSpeedEngineWrapper:
    """Drives a DeepSpeed engine from ``accelerator.backward`` (planned)."""

    def __init__(self, engine):
        raise _deepspeed("DeepSpeedEngineWrapper")

    def backward(self, loss, sync_gradients=True, **kwargs):
        raise _deepspeed("DeepSpeedEngineWrapper.backward")

    def get_global_grad_norm(self):
        raise _deepspeed("DeepSpeedEngineWrapper.get_global_grad_norm")


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """An optimizer whose steps the DeepSpeed engine takes (planned)."""

    def __init__(self, optimizer):
        raise _deepspeed("DeepSpeedOptimizerWrapper")

    def zero_grad(self, set_to_none=None):
        pass  # the engine zeroes the gradients in accelerator.backward

    def step(self):
        pass  # the engine steps in accelerator.backward

    @property
    def step_was_skipped(self):
        return False


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """A scheduler the DeepSpeed engine steps (planned)."""

    def __init__(self, scheduler, optimizers):
        raise _deepspeed("DeepSpeedSchedulerWrapper")

    def step(self):
        pass  # the engine steps the scheduler in accelerator.backward


class DummyOptim:
    """Stands for the optimizer defined in the DeepSpeed config: holds the parameters and a few options."""

    def __init__(self, params, lr=0.001, weight_decay=0, **kwargs):
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Stands for the scheduler defined in the DeepSpeed config (or built by ``lr_scheduler_callable(optimizer)``)."""

    def __init__(self, optimizer, total_num_steps=None, warmup_num_steps=0, lr_scheduler_callable=None, **kwargs):
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs
