"""A plan as a text table: one row per layout, sizes in GiB per rank, host memory in GiB per machine."""
from __future__ import annotations

from typing import Any, Optional, Protocol

from .traces import StepShape


class _Planned(Protocol):
    """What the table reads of a ``planner.Plan`` (which prints itself through here)."""

    model: str
    shape: StepShape
    budget: int
    rows: list[Any]
    notes: list[str]

    @property
    def best(self) -> Any: ...

__all__ = ["plan_table"]

_COLUMNS = ("layout", "status", "mb", "AC", "weights", "grads", "optim", "activ", "temp", "comm", "peak/rank",
            "host/machine", "step s", "tokens/s")


def _in(unit: int, size: Optional[int]) -> str:
    return "-" if size is None else f"{size / unit:.2f}"


def plan_table(plan: _Planned) -> str:
    """The table ``hasten plan`` prints (see docs/plan.md for what each column means)."""
    unit, unit_name = (2 ** 30, "GiB") if plan.budget >= 2 ** 30 else (2 ** 20, "MiB")  # MiB for tiny models

    def _gib(size: Optional[int]) -> str:
        return _in(unit, size)

    lines = []
    for row in plan.rows:
        if row.memory is None:
            lines.append((row.layout.name, "invalid: " + row.reason))
            continue
        part = row.memory.device
        lines.append((row.layout.name, row.status, str(row.micro_batch_size), "on" if row.activation_checkpointing
                      else "off", _gib(part.parameters + part.buffers + part.gathered_parameters),
                      _gib(part.gradients + part.gathered_gradients), _gib(part.optimizer_state),
                      _gib(part.activations), _gib(part.temporaries + part.other), _gib(part.communication),
                      _gib(part.peak), f"{_gib(row.host_per_machine_rank0_loading)} / "
                      f"{_gib(row.host_per_machine_every_rank_loading)}", f"{row.step_seconds:.3g}",
                      f"{row.tokens_per_second:,.0f}"))
    widths = [max([len(column)] + [len(line[i]) for line in lines if len(line) == len(_COLUMNS)])
              for i, column in enumerate(_COLUMNS)]
    header = "  ".join(column.ljust(width) for column, width in zip(_COLUMNS, widths))
    out = [f"{plan.model}: seq_len {plan.shape.seq_len}, {plan.shape.mixed_precision}, {plan.shape.optimizer}, "
           f"gradient accumulation {plan.shape.gradient_accumulation_steps}; "
           f"budget {_gib(plan.budget)} {unit_name} per "
           f"device (sizes in {unit_name} per rank; host: rank-0 loading / every rank loading, per machine)", header,
           "-" * len(header)]
    for line in lines:
        if len(line) == 2:
            out.append(f"{line[0].ljust(widths[0])}  {line[1]}")
        else:
            out.append("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    out.extend(f"note: {note}" for note in plan.notes)
    best = plan.best
    out.append(f"best: {best.layout.name} ({best.tokens_per_second:,.0f} tokens/s estimated)" if best else
               "best: none fits (add memory or processes, activation checkpointing or offload, or a smaller "
               "micro-batch)")
    return "\n".join(out)
