"""One rank's memory under each layout, from the traces (``traces.py``) and what each strategy adds.

How each layout is modelled (docs/plan.md has the same list for users):

- ``single``: the trace of the steps on one device.
- ``ddp``: the same, plus DDP's gradient buckets (one copy of the gradients, allocated by its C++ reducer, which the
  trace cannot see) when there are several processes.
- ``fsdp2``, ``hsdp``, ``fsdp2_tp``, ``cp``: hasten's own FSDP2 sharding traced over the fake process group at the
  number of shards (HSDP: the processes of one machine; with tensor parallelism, of the narrowed model each rank
  computes; with context parallelism, each rank's share of the sequence). ``fsdp2_offload`` moves the shards of
  parameters, gradients and optimizer state to host memory. ``fsdp1`` is modelled as FSDP2 (its flat parameters add
  at most a little padding).
- ``tp``: the model narrowed to one rank's heads and MLP width (the replicated parts and the all-reduced outputs full
  size), plus DDP buckets across the replicas.
- ``zero``: DeepSpeed's partitioning, counted: 16-bit weights and gradients and float32 master weights with the
  optimizer state under mixed precision (float32 weights and gradients without), the optimizer state partitioned
  from stage 1, gradients from stage 2, weights from stage 3 (with two blocks gathered: the one computing and the
  one prefetched), the reduce bucket hasten's ``"auto"`` sizes (hidden x hidden elements, twice: overlapped
  communication), and the activations and temporaries of a trace of the model in 16 bits. Offload moves the
  optimizer's partition and its float32 gradients (and at stage 3 the weights) to host memory.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from .layouts import Layout
from .step_memory import MemoryBreakdown
from .traces import ADAM8BIT_STATE, StepShape, Tracer

__all__ = ["RankMemory", "layout_memory", "ZERO_BUCKET_DEFAULT"]

ZERO_BUCKET_DEFAULT = 500_000_000  # DeepSpeed's reduce_bucket_size when the model names no hidden size
_HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class RankMemory:
    """One rank's device memory at the peak, the host memory it keeps offloaded, and how it was modelled."""

    device: MemoryBreakdown
    host: int = 0
    note: str = ""


def _with_8bit_state(memory: MemoryBreakdown, shape: StepShape) -> MemoryBreakdown:
    """bitsandbytes' 8-bit Adam (traced as a stateless step): its two 8-bit moments per local parameter added."""
    if shape.optimizer != "adam8bit":
        return memory
    return replace(memory, optimizer_state=memory.optimizer_state + round(memory.parameters / 4 * ADAM8BIT_STATE))


def _plus_buckets(memory: MemoryBreakdown, replicas: int) -> MemoryBreakdown:
    """DDP's buckets: a copy of the gradients (as many bytes as the float32 weights) across ``replicas`` > 1."""
    if replicas < 2:
        return memory
    return replace(memory, communication=memory.communication + memory.parameters)


def _zero(layout: Layout, tracer: Tracer, micro_batch: Optional[int]) -> RankMemory:
    shape, source = tracer.shape, tracer.source
    full = tracer.single(micro_batch=micro_batch)
    numel = full.parameters // 4
    half = _HALF.get(shape.mixed_precision)
    width = 2 if half is not None else 4
    base = tracer.single(weights_dtype=half, micro_batch=micro_batch) if half is not None else full
    stage, shards = layout.zero_stage or 0, layout.processes
    weights = gradients = numel * width
    state = full.optimizer_state if shape.optimizer != "adam8bit" else round(numel * ADAM8BIT_STATE)
    optimizer = state + (numel * 4 if half is not None else 0)  # float32 master weights under mixed precision
    host = 0
    if stage >= 1:
        optimizer //= shards
    if stage >= 2:
        gradients //= shards
    if stage >= 3:
        weights //= shards
    if layout.offload_optimizer:
        host += optimizer + numel * 4 // shards  # the partition's state and its float32 gradients
        optimizer = 0
    if layout.offload_parameters:
        host += weights
        weights = 0
    bucket = min(numel, (source.hidden_size ** 2) if source.hidden_size else ZERO_BUCKET_DEFAULT) * width
    gathered = 2 * tracer.block_bytes() // 4 * width if stage >= 3 else 0
    device = MemoryBreakdown(parameters=weights, buffers=base.buffers, gradients=gradients, optimizer_state=optimizer,
                             activations=base.activations, temporaries=base.temporaries, other=base.other,
                             gathered_parameters=gathered, communication=2 * bucket)
    return RankMemory(device, host, "DeepSpeed's partitions counted; activations traced in 16 bits"
                      if half is not None else "DeepSpeed's partitions counted")


def layout_memory(layout: Layout, tracer: Tracer, micro_batch: Optional[int] = None) -> RankMemory:
    """One rank's ``RankMemory`` under ``layout`` (see the module docstring), at ``micro_batch`` (default: the
    shape's)."""
    shape = tracer.shape
    family, processes = layout.family, layout.processes
    if family == "zero":
        return _zero(layout, tracer, micro_batch)
    if family in ("single", "ddp"):
        memory = tracer.single(micro_batch=micro_batch)
        return RankMemory(_with_8bit_state(_plus_buckets(memory, processes if family == "ddp" else 1), shape))
    if family == "tp":
        memory = tracer.single(narrowed_by=layout.tp, micro_batch=micro_batch)
        return RankMemory(_with_8bit_state(_plus_buckets(memory, layout.data_parallel), shape),
                          note="the model narrowed to one rank's heads and MLP width")
    if family == "fsdp2_tp":
        memory = tracer.fsdp2(layout.data_parallel, narrowed_by=layout.tp, micro_batch=micro_batch)
        return RankMemory(_with_8bit_state(memory, shape), note="FSDP2 over the narrowed model")
    if family == "cp":
        memory = tracer.fsdp2(processes, seq_len=shape.seq_len // layout.cp, micro_batch=micro_batch)
        return RankMemory(_with_8bit_state(memory, shape), note="FSDP2 on each rank's share of the sequence")
    world = layout.per_machine if family == "hsdp" else processes
    memory = _with_8bit_state(tracer.fsdp2(world, micro_batch=micro_batch), shape)
    if family == "fsdp2_offload":
        host = memory.parameters + memory.gradients + memory.optimizer_state
        return RankMemory(replace(memory, parameters=0, gradients=0, optimizer_state=0), host,
                          "shards of weights, gradients and optimizer state in host memory")
    return RankMemory(memory, note="modelled as FSDP2" if family == "fsdp1" else "")
