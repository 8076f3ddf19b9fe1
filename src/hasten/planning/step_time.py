"""A step time for each layout, from a documented cost model: to rank the layouts that fit, not to promise a speed.

One optimizer step of one rank costs, added up without overlap (a conservative order of magnitude):

- compute: ``(6 + 2 if activation checkpointing) x parameters x tokens`` FLOPs for the matrix products (forward 2,
  backward 4, the recomputed forward 2) plus ``12 x layers x hidden x seq_len^2 x micro-batch`` for attention
  (forward and backward), divided by tensor and context parallelism, at ``Hardware.tflops``;
- communication, ring collectives at the bus bandwidth of the group's link (within a machine, or across machines
  when the group spans them): DDP / ZeRO 0-2 all-reduce the gradients (``2 (n-1)/n`` of their bytes); FSDP and ZeRO-3
  all-gather the 16-bit weights twice and reduce-scatter the gradients per micro-batch (``3 (n-1)/n``); tensor
  parallelism all-reduces each layer's output twice forward and twice backward; context parallelism all-gathers the
  keys and values per layer forward and backward;
- offload: the optimizer's partition stepped on the CPU (``Hardware.cpu_params_per_s``) and its gradients and
  weights crossing the host link (``Hardware.host_link_gbps``), the weights again per micro-batch at stage 3 with
  parameter offload.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .layouts import Layout
from .model_source import ModelSource
from .traces import StepShape

__all__ = ["Hardware", "step_seconds"]


@dataclass(frozen=True)
class Hardware:
    """The throughputs the cost model assumes (override them to match your machines)."""

    tflops: float = 400.0  # achieved dense 16-bit TFLOP/s of one GPU (an H100 at ~40% of its peak)
    intra_node_gbps: float = 300.0  # GB/s of bus bandwidth between the GPUs of one machine (NVLink)
    inter_node_gbps: float = 25.0  # GB/s per GPU between machines (a 200 Gb/s network)
    host_link_gbps: float = 25.0  # GB/s between a GPU and its host's memory (PCIe)
    cpu_params_per_s: float = 1e9  # parameters a CPU optimizer updates per second per process


def _ring(bytes_: float, group: int, bandwidth_gbps: float, factor: float) -> float:
    return 0.0 if group < 2 else factor * (group - 1) / group * bytes_ / (bandwidth_gbps * 1e9)


def step_seconds(layout: Layout, source: ModelSource, shape: StepShape, parameters: int,
                 hardware: Optional[Hardware] = None, micro_batch: Optional[int] = None) -> float:
    """Estimated seconds of one optimizer step of ``layout`` (see the module docstring); ``parameters``: the
    model's parameter count."""
    hw = hardware or Hardware()
    micro = micro_batch or shape.micro_batch_size
    accumulation = shape.gradient_accumulation_steps
    tokens = micro * shape.seq_len * accumulation
    split = layout.tp * layout.cp
    flops = (8 if shape.activation_checkpointing else 6) * parameters * tokens / split
    if source.layers and source.hidden_size:
        flops += 12 * source.layers * source.hidden_size * shape.seq_len ** 2 * micro * accumulation / split
    seconds = flops / (hw.tflops * 1e12)

    half = shape.mixed_precision in ("bf16", "fp16")
    weight_bytes = parameters * (2 if half else 4)
    data = layout.data_parallel * layout.cp
    spans = layout.machines > 1
    dp_link = hw.inter_node_gbps if spans else hw.intra_node_gbps
    family = layout.family
    if family in ("ddp", "tp") or (family == "zero" and (layout.zero_stage or 0) < 3):
        grad_bytes = parameters * 4 if family != "zero" or not half else weight_bytes
        seconds += _ring(grad_bytes / layout.tp, data if family != "tp" else layout.data_parallel, dp_link, 2)
    elif family in ("fsdp2", "fsdp2_offload", "fsdp1", "hsdp", "fsdp2_tp", "cp", "zero"):
        shard_group = layout.per_machine if family == "hsdp" else data
        link = hw.intra_node_gbps if family == "hsdp" else dp_link
        seconds += accumulation * _ring(weight_bytes / layout.tp, shard_group, link, 3)
        if family == "hsdp":
            seconds += _ring(weight_bytes / shard_group, layout.machines, hw.inter_node_gbps, 2)
    if layout.tp > 1 and source.layers and source.hidden_size:
        activation = micro * shape.seq_len * source.hidden_size * (2 if half else 4)
        seconds += accumulation * source.layers * 4 * _ring(activation, layout.tp, hw.intra_node_gbps, 2)
    if layout.cp > 1 and source.layers and source.hidden_size and source.heads:
        kv_width = source.hidden_size * (source.kv_heads or source.heads) // source.heads
        kv = 2 * micro * shape.seq_len * kv_width * (2 if half else 4)
        seconds += accumulation * source.layers * 2 * _ring(kv, layout.cp, dp_link, 1)
    shards = layout.processes
    if layout.offload_optimizer or family == "fsdp2_offload":
        seconds += parameters / shards / hw.cpu_params_per_s
        seconds += 2 * weight_bytes / shards / (hw.host_link_gbps * 1e9)
    if layout.offload_parameters:
        seconds += accumulation * 2 * weight_bytes / shards / (hw.host_link_gbps * 1e9)
    return seconds
