"""Knowing before launch what a training run needs in memory: ``plan`` (``hasten plan``) and its parts.

``step_memory`` measures the memory of training steps on one device, by category, on fake tensors (a prediction:
nothing is allocated, so any model size plans in seconds) or on real ones (a measurement); ``sharded_memory`` does
the same per rank under FSDP2 at any number of processes, on PyTorch's fake process group (``fsdp1_memory`` under
FSDP1); all with PyTorch's own
trackers (``torch_tools``, the one module that touches PyTorch's private tools). ``plan`` builds every layout's row
from them (``traces``, ``layouts``, ``layout_memory``, ``step_time``), prints it (``table``) and writes the chosen
layout as a launch config (``launch_config``).
"""
from ..core.lazy import build_table, lazy_exports

_EXPORTS = build_table({
    "hasten.planning.fsdp1_memory": ["fsdp1_step_memory"],
    "hasten.planning.model_source": ["ModelSource", "PlanInputError"],
    "hasten.planning.planner": ["Plan", "PlanRow", "plan"],
    "hasten.planning.sharded_memory": ["fsdp2_step_memory"],
    "hasten.planning.step_memory": ["MemoryBreakdown", "training_step_memory"],
})
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)  # torch is imported when a name is used, not before
