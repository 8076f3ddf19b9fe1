"""Kwargs handlers: small dataclasses that pass options to the PyTorch objects hasten builds for you.

Give them to ``Accelerator(kwargs_handlers=[...])``. Each knows its own defaults; ``to_kwargs()`` returns only
the options you changed, so PyTorch's own defaults apply to everything else.
"""
from __future__ import annotations

import copy
import datetime
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Callable, Container, Literal, Optional

from .booleans import normalize_bool_fields
from .enums import _StrEnum

if TYPE_CHECKING:
    import torch.profiler
    from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "KwargsHandler", "DistributedDataParallelKwargs", "DDPCommunicationHookType", "GradScalerKwargs",
    "InitProcessGroupKwargs", "AutocastKwargs", "ProfileKwargs", "ProfilerActivity",
]

ProfilerActivity = Literal["cpu", "xpu", "mtia", "cuda", "hpu"]  # values of ProfileKwargs.activities


class KwargsHandler:
    """Base class: ``to_kwargs()`` gives the fields whose value differs from the dataclass default."""

    def __post_init__(self):
        normalize_bool_fields(self)  # boolean options written as text ("no", "true") are read, not bool()-ed

    def to_dict(self) -> dict:
        """Every field (and attribute) with its value, as a deep copy."""
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict:
        defaults = self.__class__()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(defaults, f.name)}


class DDPCommunicationHookType(_StrEnum):
    """DDP gradient communication hooks (torch.distributed.algorithms.ddp_comm_hooks)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Options of ``torch.nn.parallel.DistributedDataParallel``, plus a communication hook.

    ``comm_hook`` compresses gradients (fp16/bf16) or uses PowerSGD; ``comm_wrapper`` (fp16/bf16) wraps a PowerSGD
    hook; ``comm_state_option`` configures the PowerSGD state (e.g. ``{"matrix_approximation_rank": 2}``).
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        self.comm_hook = DDPCommunicationHookType.parse(self.comm_hook, "comm_hook")
        self.comm_wrapper = DDPCommunicationHookType.parse(self.comm_wrapper, "comm_wrapper")
        if self.comm_wrapper not in (DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16,
                                     DDPCommunicationHookType.BF16):
            raise ValueError(f"comm_wrapper must be 'no', 'fp16' or 'bf16', got {self.comm_wrapper.value!r}.")
        if self.comm_wrapper != DDPCommunicationHookType.NO and self.comm_hook not in (
                DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD):
            raise ValueError("comm_wrapper only wraps a PowerSGD hook: set comm_hook='power_sgd' or "
                             "'batched_power_sgd', or leave comm_wrapper at 'no'.")

    def to_dict(self, ignore_keys: Container[str] = ("comm_hook", "comm_wrapper", "comm_state_option")) -> dict:
        """The fields without ``ignore_keys`` (by default the hook options, which are not DDP arguments)."""
        return {k: v for k, v in super().to_dict().items() if k not in ignore_keys}

    def to_kwargs(self) -> dict:
        """Only the DistributedDataParallel constructor options (the hook is registered separately)."""
        kwargs = super().to_kwargs()
        for key in ("comm_hook", "comm_wrapper", "comm_state_option"):
            kwargs.pop(key, None)
        return kwargs

    def register_comm_hook(self, model: DistributedDataParallel) -> None:
        """Register the chosen hook on a DDP-wrapped ``model`` (no-op when ``comm_hook='no'``)."""
        if self.comm_hook == DDPCommunicationHookType.NO:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        hooks = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
            DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
            DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }
        hook = hooks[self.comm_hook]
        state = None
        if self.comm_hook in (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD):
            state = powerSGD_hook.PowerSGDState(process_group=None, **self.comm_state_option)
            wrappers = {DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
                        DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper}
            if self.comm_wrapper in wrappers:
                hook = wrappers[self.comm_wrapper](hook)
        model.register_comm_hook(state, hook)


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Options of ``torch.amp.GradScaler`` (used with fp16 mixed precision)."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Options of ``torch.distributed.init_process_group``.

    ``backend=None`` picks gloo on CPU and nccl on CUDA. ``timeout`` (a ``timedelta`` or seconds) bounds every
    collective: a process that waits longer fails instead of hanging.
    """

    backend: Optional[str] = None
    init_method: Optional[str] = None
    timeout: Optional[datetime.timedelta] = None

    def __post_init__(self):
        super().__post_init__()
        if self.timeout is not None and not isinstance(self.timeout, datetime.timedelta):
            if not isinstance(self.timeout, (int, float)) or self.timeout <= 0:
                raise ValueError(f"timeout must be a timedelta or a positive number of seconds, got {self.timeout!r}.")
            self.timeout = datetime.timedelta(seconds=self.timeout)


@dataclass
class AutocastKwargs(KwargsHandler):
    """Options of ``torch.autocast`` for mixed precision."""

    enabled: bool = True
    cache_enabled: Optional[bool] = None


@dataclass
class ProfileKwargs(KwargsHandler):
    """Options of ``torch.profiler.profile`` for ``Accelerator.profile()``.

    ``activities`` is a list of "cpu", "cuda", "xpu"...; ``schedule_option`` a dict for
    ``torch.profiler.schedule`` (wait, warmup, active, repeat, skip_first); ``output_trace_dir`` exports a
    Chrome trace per process there when no ``on_trace_ready`` is given.
    """

    activities: Optional[list] = None
    schedule_option: Optional[dict] = None
    on_trace_ready: Optional[Callable] = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: Optional[str] = None

    def build(self) -> torch.profiler.profile:
        """A ``torch.profiler.profile`` configured from these options."""
        import torch.profiler as profiler

        names = {"cpu": profiler.ProfilerActivity.CPU, "cuda": profiler.ProfilerActivity.CUDA}
        if hasattr(profiler.ProfilerActivity, "XPU"):
            names["xpu"] = profiler.ProfilerActivity.XPU
        activities = None
        if self.activities is not None:
            unknown = [a for a in self.activities if a not in names]
            if unknown:
                raise ValueError(f"Unknown profiler activities {unknown}; choose from {sorted(names)}.")
            activities = [names[a] for a in self.activities]
        schedule = profiler.schedule(**self.schedule_option) if self.schedule_option else None
        return profiler.profile(
            activities=activities, schedule=schedule, on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes, profile_memory=self.profile_memory, with_stack=self.with_stack,
            with_flops=self.with_flops, with_modules=self.with_modules,
        )
