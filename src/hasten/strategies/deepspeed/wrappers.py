"""The objects a DeepSpeed run hands the script: the prepared engine, optimizer and scheduler wrappers, the config's
placeholders (``DummyOptim`` / ``DummyScheduler``), the CPU-offload optimizer mapping and ``GatheredParameters``
(ZeRO-3 partitions gathered for a block). Accelerate has them under ``accelerate.utils.deepspeed`` (and
``GatheredParameters`` under ``accelerate.utils.operations``). deepspeed is imported only when an engine or a
DeepSpeed optimizer is built.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Protocol, Sequence, Union

import torch
from torch import nn

from ...config.deepspeed import HfDeepSpeedConfig
from ...config.enums import DistributedType
from ...optimizer import AcceleratedOptimizer
from ...scheduler import AcceleratedScheduler
from ...state import GradientState

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine

    from ...config.deepspeed import DeepSpeedPlugin
    from ...state import AcceleratorState

__all__ = [
    "map_pytorch_optim_to_deepspeed", "get_active_deepspeed_plugin", "HfDeepSpeedConfig", "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper", "DummyOptim", "DummyScheduler", "GatheredParameters",
]


class _StepsEngines(Protocol):
    """What the prepared optimizer asks of its strategy (``DeepSpeedStrategy``): one engine step per cycle."""

    def step(self, engine: DeepSpeedEngine) -> None: ...


def map_pytorch_optim_to_deepspeed(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """DeepSpeed's CPU version of ``optimizer`` for ZeRO-Offload: ``torch.optim.Adam`` / ``AdamW`` become
    ``DeepSpeedCPUAdam`` (``adamw_mode`` for AdamW), ``Adagrad`` becomes ``DeepSpeedCPUAdagrad``, with the same
    parameter groups and hyperparameters. Other optimizers are returned as they are (DeepSpeed then runs them on
    the CPU with ``zero_force_ds_cpu_optimizer: false``)."""
    from ...core.imports import require_deepspeed

    require_deepspeed()
    defaults = {k: v for k, v in optimizer.defaults.items() if k in ("lr", "weight_decay")}
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        defaults.update(betas=optimizer.defaults["betas"], eps=optimizer.defaults["eps"],
                        amsgrad=optimizer.defaults.get("amsgrad", False))
        return DeepSpeedCPUAdam(optimizer.param_groups, adamw_mode=isinstance(optimizer, torch.optim.AdamW),
                                **defaults)
    if isinstance(optimizer, torch.optim.Adagrad):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        defaults.update(eps=optimizer.defaults["eps"])
        return DeepSpeedCPUAdagrad(optimizer.param_groups, **defaults)
    return optimizer


def get_active_deepspeed_plugin(state: AcceleratorState) -> DeepSpeedPlugin:
    """The ``DeepSpeedPlugin`` in use; a ``ValueError`` when the run does not use DeepSpeed."""
    if state.distributed_type != DistributedType.DEEPSPEED:
        raise ValueError("No DeepSpeedPlugin is active: this run does not use DeepSpeed.")
    plugins = state.deepspeed_plugins
    if not isinstance(plugins, dict):
        return plugins
    return next(plugin for plugin in plugins.values() if plugin.selected)


class DeepSpeedEngineWrapper:
    """Runs the backward and the step of a DeepSpeed engine the way ``accelerator.backward`` does (for code that
    drives an engine by hand): ``sync_gradients`` is the accumulation boundary."""

    def __init__(self, engine: DeepSpeedEngine):
        self.engine = engine

    def backward(self, loss: torch.Tensor, sync_gradients: bool = True, **kwargs: Any) -> None:
        self.engine.set_gradient_accumulation_boundary(sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()

    def get_global_grad_norm(self) -> Optional[float]:
        """The gradients' global 2-norm of the engine's last step, as a number (DeepSpeed may give a tensor)."""
        norm = self.engine.get_global_grad_norm()
        return norm.item() if isinstance(norm, torch.Tensor) else norm


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The prepared optimizer under DeepSpeed: ``step()`` takes the engine's step at the end of an accumulation
    cycle (unscaling, clipping, the update and zeroing the gradients are the engine's); ``zero_grad()`` leaves the
    gradients to the engine. ``optimizer`` is the engine's (ZeRO) optimizer."""

    def __init__(self, optimizer: torch.optim.Optimizer, strategy: Optional[_StepsEngines] = None,
                 engine: Optional[DeepSpeedEngine] = None, client_optimizer: Optional[torch.optim.Optimizer] = None):
        self.optimizer = optimizer
        self.scaler = None
        self.device_placement = False
        self.gradient_state = GradientState()
        self._step_was_skipped = False
        self._is_overflow = False
        self.strategy = strategy
        self.engine = engine
        #: the optimizer the user passed to prepare() (None when the DeepSpeed config defines it)
        self.client_optimizer = client_optimizer

    @property
    def state(self) -> dict[Any, Any]:
        return getattr(self.optimizer, "state", {})

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        return getattr(self.optimizer, "defaults", {})

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        pass  # the engine zeroes the gradients after its step

    def step(self, closure: Optional[Callable[[], float]] = None) -> None:
        if not self.gradient_state.sync_gradients:
            return None
        if self.strategy is not None:
            self.strategy.step(self.engine)
        self._step_was_skipped = bool(getattr(self.optimizer, "overflow", False))
        return None

    @property
    def step_was_skipped(self) -> bool:
        """Whether the engine skipped its last step (fp16 overflow)."""
        return self._step_was_skipped

    def __repr__(self) -> str:
        return f"DeepSpeedOptimizerWrapper({type(self.optimizer).__name__})"


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """A scheduler the DeepSpeed engine steps inside its own step: ``step()`` here does nothing."""

    def __init__(self, scheduler: Any, optimizers: Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]):
        super().__init__(scheduler, optimizers)

    def step(self, *args: Any, **kwargs: Any) -> None:
        pass  # the engine steps it with the optimizer


class DummyOptim:
    """Stands for the optimizer defined in the DeepSpeed config: holds the parameters and a few options."""

    def __init__(self, params: Iterable[Union[nn.Parameter, dict[str, Any]]], lr: float = 0.001,
                 weight_decay: float = 0, **kwargs: Any):
        self.params = list(params)  # model.parameters() is a generator: read it once, here
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Stands for the scheduler defined in the DeepSpeed config (or built by ``lr_scheduler_callable(optimizer)``)."""

    def __init__(self, optimizer: Union[DummyOptim, torch.optim.Optimizer], total_num_steps: Optional[int] = None,
                 warmup_num_steps: int = 0,
                 lr_scheduler_callable: Optional[Callable[[torch.optim.Optimizer], Any]] = None, **kwargs: Any):
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


@contextlib.contextmanager
def GatheredParameters(params: Union[nn.Parameter, Iterable[nn.Parameter]], modifier_rank: Optional[int] = None,
                       fwd_module: Optional[nn.Module] = None, enabled: bool = True) -> Iterator[None]:
    """Gather DeepSpeed ZeRO-3 partitioned ``params`` for the duration of the block
    (``deepspeed.zero.GatheredParameters``); a no-op context in every other setting, where parameters are
    whole already."""
    from ...state import AcceleratorState

    context = contextlib.nullcontext()
    state = AcceleratorState.current()
    if state is not None and state.distributed_type == DistributedType.DEEPSPEED:
        plugin = getattr(state, "deepspeed_plugin", None)
        if plugin is None or plugin.hf_ds_config.is_zero3():  # ZeRO-3 partitions every prepared model
            from ...core.imports import require_extra

            deepspeed = require_extra("deepspeed", "GatheredParameters under ZeRO-3")
            context = deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank, fwd_module=fwd_module,
                                                        enabled=enabled)
    with context:
        yield
