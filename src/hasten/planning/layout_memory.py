"""One rank's memory under each layout, from the traces (``traces.py``) and what each strategy adds.

How each layout is modelled (docs/plan.md has the same list for users):

- ``single``: the trace of the steps on one device.
- ``ddp``: the same, plus DDP's gradient buckets (one copy of the gradients, allocated by its C++ reducer, which the
  trace cannot see) when there are several processes.
- ``fsdp2``, ``hsdp``, ``fsdp2_tp``, ``cp``: hasten's own FSDP2 sharding traced over the fake process group at the
  number of shards (HSDP: the processes of one machine, that mesh replicated across the machines; with tensor
  parallelism, of the narrowed model each rank computes; with context parallelism, each rank's share of the
  sequence). ``fsdp2_offload`` moves the shards of parameters, gradients and optimizer state to host memory.
- ``fsdp1``: FSDP1 itself traced over the fake process group, with the options of the config the plan writes
  (``fsdp1_memory.py``).
- ``tp``: the model narrowed to one rank's heads and MLP width (the replicated parts and the all-reduced outputs full
  size; the output layer's and the input embedding's shares of the vocabulary where the plan splits them); with
  data-parallel replicas, that model under FSDP2 with one rank per shard group, replicated, as hasten runs DDP x TP
  (the whole model one unit unless activation checkpointing, whose config section makes each block one).
- ``zero``: DeepSpeed's partitioning, counted per parameter (checked against DeepSpeed runs on gloo, bench_plan.py):
  the weights and gradients in the run's dtype, and for this rank's partition a float32 copy, the optimizer state
  and float32 gradients for the step (at stage 0 in float32 the model's own weights and gradients are those); the
  partition is 1/N of the model from stage 1, the run-dtype gradients are partitioned from stage 2 and the weights
  from stage 3 (where parameters under DeepSpeed's persistence threshold stay whole, and two blocks are gathered:
  the one computing and the one prefetched); DeepSpeed's default gradient bucket from stage 1 (500M elements,
  allocated whole), at stage 0 the float32 gradients flattened once for the all-reduce; the activations and
  temporaries of a trace of the model in 16 bits under mixed precision. Offload moves the partition's float32 copy,
  state and gradients (and at stage 3 with ``+offload_all`` the weights) to host memory.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from .layouts import Layout
from .step_memory import MemoryBreakdown
from .traces import ADAM8BIT_STATE, StepShape, Tracer

__all__ = ["RankMemory", "layout_memory", "ZERO_BUCKET_ELEMENTS", "ZERO3_PERSISTENCE_THRESHOLD"]

#: DeepSpeed's defaults, which the config ``hasten plan --write_config`` writes runs with: the gradient bucket it
#: allocates whole (elements, in the gradients' dtype) and the size under which ZeRO-3 keeps a parameter whole
ZERO_BUCKET_ELEMENTS = 500_000_000
ZERO3_PERSISTENCE_THRESHOLD = 100_000
#: bytes of optimizer state per parameter of the float32 partition
_STATE_PER_PARAMETER = {"adamw": 8, "adam": 8, "sgd": 0, "sgd_momentum": 4}
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


def _optimizer_state_per_parameter(tracer: Tracer) -> float:
    """Bytes of optimizer state per parameter, as DeepSpeed holds it for its float32 partition."""
    name = tracer.shape.optimizer
    if name == "adam8bit":
        return ADAM8BIT_STATE
    if name in _STATE_PER_PARAMETER:
        return _STATE_PER_PARAMETER[name]
    full = tracer.single()
    return full.optimizer_state / max(1, full.parameters // 4)  # traced (Adafactor's factored moments)


def _zero(layout: Layout, tracer: Tracer, micro_batch: Optional[int]) -> RankMemory:
    shape = tracer.shape
    full = tracer.single(micro_batch=micro_batch)
    numel = full.parameters // 4
    half = _HALF.get(shape.mixed_precision)
    width = 2 if half is not None else 4
    phases = tracer.single_phases(weights_dtype=half, micro_batch=micro_batch)
    # the optimizer step's trace holds what a loop keeps through it: the last micro-batch's output and batch
    base, stepping = phases["forward_backward"], phases["optimizer"]
    stage, shards = layout.zero_stage or 0, layout.processes
    partition = numel / (shards if stage >= 1 else 1)
    # the float32 copy of this rank's partition, its optimizer state, and its float32 gradients for the step; at
    # stage 0 in float32 the model's own weights and gradients are those (DeepSpeed wraps no optimizer around it)
    unwrapped = stage == 0 and half is None
    master = 0 if unwrapped else 4 * partition
    optimizer = round(master + _optimizer_state_per_parameter(tracer) * partition)
    float32_gradients = 0 if unwrapped else round(4 * partition)
    gradient_share = 1 / shards if stage >= 2 else 1  # of the run-dtype gradients
    if stage >= 3:
        kept = tracer.parameter_count(below=ZERO3_PERSISTENCE_THRESHOLD)  # never partitioned: too small
        weights = round(width * (kept + (numel - kept) / shards))
        gathered = 2 * tracer.block_bytes() // 4 * width  # the block computing and the one prefetched
    else:
        weights = width * numel
        gathered = 0
    host = 0
    if layout.offload_optimizer:
        host += optimizer + float32_gradients
        optimizer = float32_gradients = 0
    if layout.offload_parameters:
        host += weights
        weights = 0
    # stages 1-3 allocate their gradient bucket whole; stage 0 all-reduces the float32 gradients flattened into one
    # copy (its buckets are as large as the gradients they hold)
    bucket = ZERO_BUCKET_ELEMENTS * width if stage >= 1 else 0
    flattened = round(4 * numel) if stage == 0 and layout.processes > 1 else 0
    # two moments can peak: the forward and backward (the traced activations and gradients present then), and the
    # optimizer step (every gradient, and the partition's float32 gradients)
    during_backward = MemoryBreakdown(
        parameters=weights, buffers=base.buffers, gradients=round(base.gradients * gradient_share),
        optimizer_state=optimizer, activations=base.activations, temporaries=base.temporaries, other=base.other,
        gathered_parameters=gathered, communication=bucket)
    during_step = MemoryBreakdown(
        parameters=weights, buffers=base.buffers, gradients=round(width * numel * gradient_share) + float32_gradients,
        optimizer_state=optimizer, activations=stepping.activations, temporaries=0, other=stepping.other,
        gathered_parameters=0, communication=bucket + flattened)
    device = max(during_backward, during_step, key=lambda memory: memory.peak)
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
    if family == "tp" and layout.data_parallel > 1:  # hasten's DDP x TP: FSDP2 with one rank per shard group
        # the written config has an FSDP section (the blocks as units) only to carry activation checkpointing
        memory = tracer.fsdp2(1, narrowed_by=layout.tp, micro_batch=micro_batch, replicas=layout.data_parallel,
                              units=shape.activation_checkpointing)
        return RankMemory(_with_8bit_state(memory, shape), note="FSDP2 replicating the narrowed model")
    if family == "tp":
        memory = tracer.single(narrowed_by=layout.tp, micro_batch=micro_batch)
        return RankMemory(_with_8bit_state(memory, shape), note="the model narrowed to one rank's heads and MLP width")
    if family == "fsdp2_tp":
        memory = tracer.fsdp2(layout.data_parallel, narrowed_by=layout.tp, micro_batch=micro_batch)
        return RankMemory(_with_8bit_state(memory, shape), note="FSDP2 over the narrowed model")
    if family == "cp":
        memory = tracer.fsdp2(processes, seq_len=shape.seq_len // layout.cp, micro_batch=micro_batch)
        return RankMemory(_with_8bit_state(memory, shape), note="FSDP2 on each rank's share of the sequence")
    if family == "fsdp1":
        return RankMemory(_with_8bit_state(tracer.fsdp1(processes, micro_batch=micro_batch), shape),
                          note="FSDP1's flat parameters traced")
    if family == "hsdp":  # sharded within a machine, replicated across the machines
        memory = tracer.fsdp2(layout.per_machine, micro_batch=micro_batch, replicas=layout.machines)
        return RankMemory(_with_8bit_state(memory, shape), note="FSDP2 replicated across the machines")
    memory = _with_8bit_state(tracer.fsdp2(processes, micro_batch=micro_batch), shape)
    if family == "fsdp2_offload":
        host = memory.parameters + memory.gradients + memory.optimizer_state
        return RankMemory(replace(memory, parameters=0, gradients=0, optimizer_state=0), host,
                          "shards of weights, gradients and optimizer state in host memory")
    return RankMemory(memory)
