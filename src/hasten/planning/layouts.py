"""The layouts a plan weighs: one row each, and the reason a layout cannot exist for a model and a job.

A ``Layout`` names how the job's processes hold the model: one device, DDP, FSDP2 (full shard, with CPU offload,
hybrid across machines), FSDP1, DeepSpeed ZeRO 0-3 (with optimizer / parameter offload), tensor parallelism (alone,
with DDP replicas, or under FSDP2) and context parallelism (under FSDP2). ``candidate_layouts`` lists those of a job
of ``processes`` on ``machines``; ``why_invalid`` says, in one line, why one cannot run (a degree that does not divide
the heads or the processes, a feature the model lacks), or None.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .model_source import ModelSource, PlanInputError
from .names import FAMILIES

__all__ = ["Layout", "FAMILIES", "candidate_layouts", "why_invalid"]



@dataclass(frozen=True)
class Layout:
    """One way to lay a job's ``processes`` (on ``machines``) over the model."""

    family: str
    processes: int
    machines: int = 1
    zero_stage: Optional[int] = None
    offload_optimizer: bool = False
    offload_parameters: bool = False
    tp: int = 1
    cp: int = 1

    @property
    def data_parallel(self) -> int:
        """Processes that hold different micro-batches."""
        return max(1, self.processes // (self.tp * self.cp))

    @property
    def per_machine(self) -> int:
        return max(1, self.processes // self.machines)

    @property
    def name(self) -> str:
        if self.family == "zero":
            offload = "+offload_all" if self.offload_parameters else "+offload" if self.offload_optimizer else ""
            return f"zero{self.zero_stage}{offload}"
        if self.family == "tp":
            return f"tp{self.tp}" + (f"+ddp{self.data_parallel}" if self.data_parallel > 1 else "")
        if self.family == "fsdp2_tp":
            return f"fsdp2+tp{self.tp}"
        if self.family == "cp":
            return f"fsdp2+cp{self.cp}"
        if self.family == "fsdp2_offload":
            return "fsdp2+offload"
        return self.family


def _powers_of_two(limit: int) -> list[int]:
    return [2 ** k for k in range(1, 12) if 2 ** k <= limit]


def candidate_layouts(processes: int, machines: int = 1, families: Optional[Sequence[str]] = None,
                      tp_sizes: Optional[Sequence[int]] = None,
                      cp_sizes: Optional[Sequence[int]] = None) -> list[Layout]:
    """The layouts of ``families`` (default: all) for ``processes`` on ``machines``; tensor- and context-parallel
    degrees from ``tp_sizes`` / ``cp_sizes`` (default: the powers of two up to the processes of one machine that
    divide the processes). Invalid ones are included: ``why_invalid`` says why, and the table shows it."""
    if not isinstance(processes, int) or processes < 1:
        raise PlanInputError(f"num_processes must be a positive number, got {processes!r}.")
    if not isinstance(machines, int) or machines < 1 or processes % machines:
        raise PlanInputError(f"num_machines={machines!r} must be a positive number that divides num_processes "
                             f"({processes}).")
    chosen = list(families) if families is not None else list(FAMILIES)
    unknown = [family for family in chosen if family not in FAMILIES]
    if unknown:
        raise PlanInputError(f"Unknown layout {unknown[0]!r}: choose among {', '.join(FAMILIES)}.")
    per_machine = processes // machines
    default_degrees = [d for d in _powers_of_two(per_machine) if processes % d == 0]
    tp_degrees = list(tp_sizes) if tp_sizes else default_degrees
    cp_degrees = list(cp_sizes) if cp_sizes else default_degrees
    for degree in (*tp_degrees, *cp_degrees):
        if not isinstance(degree, int) or degree < 2:
            raise PlanInputError(f"A tensor- or context-parallel degree must be a number of at least 2, "
                                 f"got {degree!r}.")
    layouts: list[Layout] = []
    for family in FAMILIES:
        if family not in chosen:
            continue
        if family == "zero":
            for stage in range(4):
                layouts.append(Layout("zero", processes, machines, zero_stage=stage))
            for stage in (1, 2, 3):
                layouts.append(Layout("zero", processes, machines, zero_stage=stage, offload_optimizer=True))
            layouts.append(Layout("zero", processes, machines, zero_stage=3, offload_optimizer=True,
                                  offload_parameters=True))
        elif family in ("tp", "fsdp2_tp"):
            layouts.extend(Layout(family, processes, machines, tp=degree) for degree in tp_degrees)
        elif family == "cp":
            layouts.extend(Layout(family, processes, machines, cp=degree) for degree in cp_degrees)
        else:
            layouts.append(Layout(family, processes, machines))
    return layouts


def why_invalid(layout: Layout, source: ModelSource, seq_len: int) -> Optional[str]:
    """Why ``layout`` cannot run ``source`` at ``seq_len`` (one line), or None."""
    processes = layout.processes
    if layout.family == "single" and processes > 1:
        return f"one device, and the job has {processes} processes"
    if layout.family == "hsdp" and layout.machines < 2:
        return "HSDP shards within a machine and replicates across machines: it needs num_machines > 1"
    if layout.family in ("tp", "fsdp2_tp"):
        degree = layout.tp
        if processes % degree:
            return f"tp {degree} does not divide the {processes} processes"
        if source.tensor_parallel:
            return source.tensor_parallel
        for count, what in ((source.heads, "attention heads"), (source.kv_heads, "key/value heads")):
            if count is not None and count % degree:
                return f"tp {degree} does not divide {count} {what}"
        if layout.family == "fsdp2_tp" and processes // degree < 2:
            return f"FSDP2 x tp {degree} needs at least 2 data-parallel shards ({processes} processes)"
        if degree > layout.per_machine:
            return f"tp {degree} spans machines ({layout.per_machine} processes each): its all-reduces would cross " \
                   "the network every layer"
    if layout.family == "cp":
        degree = layout.cp
        if processes % degree:
            return f"cp {degree} does not divide the {processes} processes"
        if source.context_parallel:
            return source.context_parallel
        if seq_len % (2 * degree):
            return f"context parallelism splits the sequence in 2 x cp = {2 * degree} load-balanced chunks: " \
                   f"seq_len {seq_len} is not a multiple"
    return None
