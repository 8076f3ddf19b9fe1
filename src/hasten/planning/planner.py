"""``hasten.plan(...)``: every layout of a run, its memory per rank, whether it fits, and an estimated step time.

``plan`` traces the model's training steps on fake tensors (``traces.py``: nothing is allocated, the depth scaled
from a few blocks), applies each layout (``layout_memory.py``), compares each rank's peak with the device's memory
(``gpu_memory``, less ``reserve``) and ranks the layouts that fit by the cost model of ``step_time.py``. With
``search`` each layout gets the largest micro-batch that fits (found on the line through traces at 1 and 2, then
confirmed by tracing the size found and the next). With ``activation_checkpointing="auto"`` a layout that does not
fit without it is planned with it. The result prints as a table (``Plan.table()``) or JSON (``Plan.as_json()``), and
a row writes itself as a launch config (``launch_config.py``).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence, Union

from torch import nn

from .layout_memory import RankMemory, layout_memory
from .layouts import Layout, candidate_layouts, why_invalid
from .model_source import ModelSource, PlanInputError, factory_source, source_from_name, transformers_source
from .step_time import Hardware, step_seconds
from .traces import StepShape, Tracer

__all__ = ["Plan", "PlanRow", "plan", "parse_memory"]

_PRECISIONS = ("no", "bf16", "fp16")
_CHECKPOINTING = {"off": (False,), "on": (True,), "auto": (False, True)}


def parse_memory(value: Union[int, float, str], what: str = "gpu_memory") -> int:
    """``"80GB"`` (10**9 bytes), ``"80GiB"`` (2**30), or a number of bytes; a one-line error otherwise."""
    from ..big_modeling.sizes import convert_file_size_to_int

    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())  # a number of bytes, as typed on a command line
    try:
        size = convert_file_size_to_int(value)
    except (ValueError, TypeError) as error:
        raise PlanInputError(f"{what}: {error}") from None
    return size


@dataclass(frozen=True)
class PlanRow:
    """One layout: ``status`` is ``"fits"``, ``"does not fit"`` or ``"invalid"`` (then ``reason`` says why)."""

    layout: Layout
    status: str
    reason: str = ""
    memory: Optional[RankMemory] = None
    micro_batch_size: Optional[int] = None
    activation_checkpointing: bool = False
    step_seconds: Optional[float] = None
    host_per_machine_rank0_loading: Optional[int] = None
    host_per_machine_every_rank_loading: Optional[int] = None
    seq_len: int = 0
    accumulation: int = 1

    @property
    def fits(self) -> bool:
        return self.status == "fits"

    @property
    def tokens_per_second(self) -> Optional[float]:
        """The job's training throughput the cost model gives: tokens of every data-parallel replica per step."""
        if self.step_seconds is None or self.micro_batch_size is None or self.memory is None:
            return None
        return self.micro_batch_size * self.seq_len * self.accumulation * self.layout.data_parallel / \
            self.step_seconds

    @property
    def peak(self) -> Optional[int]:
        return self.memory.device.peak if self.memory is not None else None

    def as_dict(self) -> dict[str, Any]:
        """The row for ``--json``: its name, parts in bytes, peak, ``fits`` and the rest."""
        parts = None
        if self.memory is not None:
            parts = {key: value for key, value in self.memory.device.as_dict().items() if key != "peak"}
        return {"name": self.layout.name, "family": self.layout.family, "status": self.status, "fits": self.fits,
                "reason": self.reason or None, "peak": self.peak, "parts": parts,
                "host_offloaded_per_rank": self.memory.host if self.memory is not None else None,
                "host_per_machine": None if self.host_per_machine_rank0_loading is None else {
                    "rank0_loading": self.host_per_machine_rank0_loading,
                    "every_rank_loading": self.host_per_machine_every_rank_loading},
                "micro_batch_size": self.micro_batch_size,
                "activation_checkpointing": self.activation_checkpointing if self.memory is not None else None,
                "step_seconds": self.step_seconds, "tokens_per_second": self.tokens_per_second,
                "note": (self.memory.note or None) if self.memory else None,
                "processes": self.layout.processes, "machines": self.layout.machines,
                "tp_size": self.layout.tp, "cp_size": self.layout.cp, "zero_stage": self.layout.zero_stage}


@dataclass
class Plan:
    """Every layout's ``PlanRow``: those that fit first, the highest throughput (tokens per second) first."""

    model: str
    shape: StepShape
    budget: int
    rows: list[PlanRow]
    notes: list[str] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)  # the model's repeated blocks: FSDP's units

    @property
    def best(self) -> Optional[PlanRow]:
        """The layout that fits with the highest throughput, or None."""
        return next((row for row in self.rows if row.fits), None)

    def row(self, name: str) -> PlanRow:
        for row in self.rows:
            if row.layout.name == name:
                return row
        raise KeyError(f"No layout {name!r} in this plan: {', '.join(row.layout.name for row in self.rows)}.")

    def as_json(self) -> list[dict[str, Any]]:
        return [row.as_dict() for row in self.rows]

    def table(self) -> str:
        """The rows as a text table (GiB per rank; host GiB per machine: rank-0 loading / every rank loading)."""
        from .table import plan_table

        return plan_table(self)

    def launch_config(self, name: Optional[str] = None) -> dict[str, Any]:
        """The config file of layout ``name`` (default: the best), as ``hasten launch --config_file`` reads it."""
        from .launch_config import launch_config

        row = self.row(name) if name is not None else self.best
        if row is None:
            raise PlanInputError("No layout fits, so there is no config to write: add memory, processes, activation "
                                 "checkpointing or offload, or lower the micro-batch size.")
        if row.status == "invalid":
            raise PlanInputError(f"Layout {row.layout.name} is invalid: {row.reason}.")
        return launch_config(row.layout, mixed_precision=self.shape.mixed_precision,
                             gradient_accumulation_steps=self.shape.gradient_accumulation_steps,
                             activation_checkpointing=row.activation_checkpointing, blocks=self.blocks)


def _source(model: Any, batch: Optional[Callable[[int, int], Any]], trust_remote_code: bool) -> ModelSource:
    if isinstance(model, ModelSource):
        return model
    if isinstance(model, str):
        return source_from_name(model, trust_remote_code=trust_remote_code)
    if hasattr(model, "model_type") and hasattr(model, "to_dict"):  # a Transformers config
        return transformers_source(model, trust_remote_code=trust_remote_code)
    if isinstance(model, nn.Module):
        raise PlanInputError("plan() builds the model itself, on fake tensors: pass a function returning it (or its "
                             "config), not a model already built.")
    if callable(model):
        return factory_source(model, batch)
    raise PlanInputError(f"plan() cannot plan a {type(model).__name__}: pass a model folder or Hub id, a "
                         "Transformers config, or a function returning an nn.Module.")


def _device_memory(gpu_memory: Optional[Union[int, str]]) -> int:
    if gpu_memory is not None:
        size = parse_memory(gpu_memory)
        if size <= 0:
            raise PlanInputError(f"gpu_memory must be positive, got {gpu_memory!r}.")
        return size
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    raise PlanInputError("No GPU here to read its memory from: give gpu_memory (e.g. --gpu_memory 80GB).")


def _check_shape(seq_len: Any, micro_batch_size: Any, gradient_accumulation_steps: Any, mixed_precision: Any,
                 activation_checkpointing: Any) -> None:
    for name, value in (("seq_len", seq_len), ("micro_batch_size", micro_batch_size),
                        ("gradient_accumulation_steps", gradient_accumulation_steps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlanInputError(f"{name} must be a positive whole number, got {value!r}.")
    if mixed_precision not in _PRECISIONS:
        raise PlanInputError(f"mixed_precision must be one of {', '.join(_PRECISIONS)}, got {mixed_precision!r}.")
    if activation_checkpointing not in _CHECKPOINTING:
        raise PlanInputError(f"activation_checkpointing must be off, on or auto, got {activation_checkpointing!r}.")


def plan(model: Any, *, seq_len: int, micro_batch_size: int = 1, search: bool = False,
         gradient_accumulation_steps: int = 1, num_processes: int = 1, num_machines: int = 1,
         gpu_memory: Optional[Union[int, str]] = None, reserve: Union[int, str] = 0, mixed_precision: str = "bf16",
         optimizer: str = "adamw", activation_checkpointing: Union[str, bool] = "off",
         layouts: Optional[Sequence[str]] = None, tp_sizes: Optional[Sequence[int]] = None,
         cp_sizes: Optional[Sequence[int]] = None, batch: Optional[Callable[[int, int], Any]] = None,
         trust_remote_code: bool = False, hardware: Optional[Hardware] = None,
         max_micro_batch_size: int = 4096) -> Plan:
    """Plan every layout of a training run before launching it (see the module docstring and docs/plan.md).

    ``model``: a local model folder (or its ``config.json``) or a Hub id (its config alone is read; code it names
    runs only with ``trust_remote_code``), a Transformers config, or a function returning an ``nn.Module`` (with
    ``batch(micro_batch_size, seq_len)`` making its input unless it is a Transformers model). ``gpu_memory``: each
    device's memory (``"80GB"``; read from the GPU when there is one), less ``reserve`` (for the CUDA context and the
    allocator: see docs/plan.md). ``layouts``: the families to consider (``layouts.FAMILIES``; default all).
    """
    if isinstance(activation_checkpointing, bool):
        activation_checkpointing = "on" if activation_checkpointing else "off"
    _check_shape(seq_len, micro_batch_size, gradient_accumulation_steps, mixed_precision, activation_checkpointing)
    budget = _device_memory(gpu_memory) - parse_memory(reserve, "reserve")
    candidates = candidate_layouts(num_processes, num_machines, layouts, tp_sizes, cp_sizes)
    source = _source(model, batch, trust_remote_code)
    notes = list(source.notes)
    if source.max_positions and seq_len > source.max_positions:
        message = (f"seq_len {seq_len} is past the model's maximum of {source.max_positions} positions: the plan is "
                   "for the length asked, which the model may not support.")
        warnings.warn(message, stacklevel=2)
        notes.append(message)
    shape = StepShape(micro_batch_size, seq_len, mixed_precision, optimizer, False, gradient_accumulation_steps)
    tracers = {flag: Tracer(source, replace(shape, activation_checkpointing=flag), search=search)
               for flag in _CHECKPOINTING[activation_checkpointing]}
    with warnings.catch_warnings():  # PyTorch's module tracker doubts itself around FSDP's hooks: not the user's
        warnings.filterwarnings("ignore", message="The module hierarchy tracking")
        rows = [_row(layout, source, tracers, budget, search, hardware, max_micro_batch_size)
                for layout in candidates]
    order = {"fits": 0, "does not fit": 1, "invalid": 2}
    rows.sort(key=lambda row: (order[row.status], -(row.tokens_per_second or 0.0) if row.fits else 0.0))
    blocks = next(iter(tracers.values())).block_names() if any(row.memory for row in rows) else []
    return Plan(source.name, shape, budget, rows, notes, blocks)


def _bisect(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest size in [low, high) that fits, given that ``low`` fits and ``high`` does not."""
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def _grow(fits: Callable[[int], bool], low: int, limit: int) -> int:
    """From a size that fits, the largest that does (at most ``limit``): steps that double, then ``_bisect``."""
    high = low + 1
    while high <= limit and fits(high):
        low, high = high, high + 2 * (high - low)
    return _bisect(fits, low, min(high, limit + 1))


def _largest_fitting(layout: Layout, tracer: Tracer, budget: int, limit: int) -> int:
    """The largest micro-batch size whose peak is within ``budget`` (0: not even 1): found on the line through
    micro-batches 1 and 2 (the peak grows with the size), then confirmed by tracing that size and the next."""
    def fits_on(on: Tracer) -> Callable[[int], bool]:
        return lambda size: layout_memory(layout, on, size).device.peak <= budget

    on_the_line = fits_on(tracer)
    if not on_the_line(1):
        return 0
    low = _grow(on_the_line, 1, limit)
    if low <= 2:
        return low  # traced, not read on the line
    traced = fits_on(tracer.exactly())
    # the line may be low (go on up while the traces fit) or high (the largest traced size below it)
    return _grow(traced, low, limit) if traced(low) else _bisect(traced, 1, low)


def _row(layout: Layout, source: ModelSource, tracers: dict, budget: int, search: bool,
         hardware: Optional[Hardware], limit: int) -> PlanRow:
    some = next(iter(tracers.values()))
    reason = why_invalid(layout, source, some.shape.seq_len)
    if reason:
        return PlanRow(layout, "invalid", reason)
    tried: Optional[tuple] = None
    for flag, tracer in tracers.items():
        if search:
            micro = _largest_fitting(layout, tracer, budget, limit)
            shown = max(micro, 1)
            memory = layout_memory(layout, tracer.exactly(), shown)  # traced at the size found
        else:
            micro = tracer.shape.micro_batch_size
            memory = layout_memory(layout, tracer)
            shown = micro
        tried = (flag, tracer, memory, shown)
        if memory.device.peak <= budget and (not search or micro > 0):
            break
    flag, tracer, memory, shown = tried
    fits = memory.device.peak <= budget
    parameters = tracer.single().parameters // 4
    stored = parameters * source.stored_bytes_per_parameter
    per_machine = layout.per_machine
    return PlanRow(layout, "fits" if fits else "does not fit", "" if fits else "the peak is above the budget",
                   memory, shown, flag,
                   step_seconds(layout, source, tracer.shape, parameters, hardware, shown),
                   stored + per_machine * memory.host, per_machine * (stored + memory.host),
                   tracer.shape.seq_len, tracer.shape.gradient_accumulation_steps)
