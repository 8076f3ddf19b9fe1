"""The memory of training steps on one device, by category: predicted on fake tensors or measured on real ones.

``training_step_memory`` builds the model and its optimizer, runs ``steps`` full training steps (forward, backward,
optimizer step, zero_grad) under PyTorch's memory tracker (``torch_tools``) and returns the breakdown at the peak.
With ``fake=True`` everything happens under ``FakeTensorMode``: tensors carry shapes and dtypes but no data, so
nothing is allocated and a model of any size plans in seconds; with ``fake=False`` the same steps run for real and
the result is a measurement. Both see the same storages, so the prediction of a step equals its measurement on the
CPU (tests/planning checks this on an MLP and on tiny Transformers models, in fp32 and under bf16 autocast). What the
tracker cannot see (allocator rounding and caching, a CUDA context, buffers a C++ library allocates itself, such as
DDP's gradient buckets) is the layout's business, added on top by the plan.

Several steps are run because the first optimizer step creates the optimizer state: the peak of the steady state
comes later.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from .torch_tools import memory_tracker, peak_by_category

__all__ = ["MemoryBreakdown", "training_step_memory", "run_steps", "highest", "check_step_arguments", "AUTOCAST_DTYPES",
           "default_loss"]

#: the mixed precisions traced under autocast, and their dtype
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes live at a step's peak, by what holds them."""

    parameters: int  # this rank's: its shards under FSDP
    buffers: int
    gradients: int  # this rank's: its shards under FSDP
    optimizer_state: int
    activations: int
    temporaries: int
    other: int
    gathered_parameters: int = 0  # FSDP: the parameters a unit gathers for its forward and backward
    gathered_gradients: int = 0  # FSDP: a unit's full gradients before they are reduce-scattered
    communication: int = 0  # FSDP: the all-gather and reduce-scatter buffers

    @property
    def peak(self) -> int:
        """The peak itself: every part summed."""
        return sum(asdict(self).values())

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "peak": self.peak}


def default_loss(output: Any) -> torch.Tensor:
    """A Transformers output's ``loss`` when it has one, else the sum of the (first) output tensor."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, (tuple, list)):
        output = output[0]
    return output.float().sum()


def _call(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def training_step_memory(build_model: Callable[[], nn.Module], make_batch: Callable[[], Any], *,
                         optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW,
                         optimizer_kwargs: Optional[dict] = None, mixed_precision: str = "no", steps: int = 3,
                         fake: bool = True, loss: Callable[[Any], torch.Tensor] = default_loss,
                         micro_batches: int = 1,
                         by_phase: bool = False) -> Union[MemoryBreakdown, dict[str, MemoryBreakdown]]:
    """The peak memory of ``steps`` training steps on the CPU, by category (with ``by_phase``, a dict of the peak
    of each phase: ``run_steps``).

    ``build_model()`` returns the model (built inside the fake mode when ``fake``), ``make_batch()`` one batch (a
    dict of keyword arguments, a tuple of positional ones, or one tensor), ``optimizer`` the optimizer class (or any
    callable taking the parameters and ``optimizer_kwargs``), ``mixed_precision`` ``"no"``, ``"bf16"`` or ``"fp16"``
    (the forward under autocast, the weights and optimizer state in their own dtype), ``loss(output)`` the loss,
    ``micro_batches`` the forwards and backwards whose gradients accumulate before each optimizer step.
    """
    check_step_arguments(mixed_precision, steps)
    mode = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
    with mode:
        model = build_model()
        optim = optimizer(model.parameters(), **(optimizer_kwargs or {}))
        tracker = memory_tracker()
        tracker.track_external(model, optim)
        phases = run_steps(model, optim, tracker, make_batch, mixed_precision=mixed_precision, steps=steps,
                           loss=loss, micro_batches=micro_batches)
    return phases if by_phase else highest(phases)


def check_step_arguments(mixed_precision: str, steps: int) -> None:
    """Refuse, before anything is built, a precision or a number of steps the planner cannot run."""
    if mixed_precision not in ("no", *AUTOCAST_DTYPES):
        raise ValueError(f"mixed_precision must be 'no', 'bf16' or 'fp16', got {mixed_precision!r}.")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}.")


def run_steps(model: nn.Module, optim: torch.optim.Optimizer, tracker: Any, make_batch: Callable[[], Any], *,
              mixed_precision: str, steps: int, loss: Callable[[Any], torch.Tensor] = default_loss,
              micro_batches: int = 1) -> dict[str, MemoryBreakdown]:
    """``steps`` training steps of ``model`` under ``tracker`` (``micro_batches`` forwards under autocast for
    ``"bf16"`` / ``"fp16"`` and backwards, the gradients accumulating, then the optimizer step and ``zero_grad``).
    Returns the peak of each phase over the steps, ``{"forward_backward": ..., "optimizer": ...}``: the tracker is
    entered once per phase (entering starts a new peak), so that each phase's parts can be scaled on their own.

    The last micro-batch's batch and output stay alive through the optimizer step, as in a training loop that
    writes ``outputs = model(**batch); accelerator.backward(outputs.loss); optimizer.step()``: a Transformers
    output holds its logits and, for a decoder, the key/value cache, which count when the peak is the optimizer's
    (activation checkpointing makes it so more often)."""
    phases: dict[str, MemoryBreakdown] = {}

    def keep(phase: str) -> None:
        found = MemoryBreakdown(**peak_by_category(tracker))
        if phase not in phases or found.peak > phases[phase].peak:
            phases[phase] = found

    for step in range(steps):
        batch = output = None
        with tracker:
            for _ in range(micro_batches):
                del batch, output  # the previous micro-batch's, before the next forward
                batch = make_batch()
                autocast = (torch.autocast("cpu", dtype=AUTOCAST_DTYPES[mixed_precision]) if mixed_precision != "no"
                            else contextlib.nullcontext())
                with autocast:
                    output = _call(model, batch)
                loss(output).backward()
        keep("forward_backward")
        with tracker:
            optim.step()
            optim.zero_grad()
            del batch, output
        keep("optimizer")
        if step < steps - 1:
            tracker.reset_mod_stats()  # the tracker's per-module records are per step
    return phases


def highest(phases: dict[str, MemoryBreakdown]) -> MemoryBreakdown:
    """The phase whose peak is highest: the peak of the steps."""
    return max(phases.values(), key=lambda phase: phase.peak)
