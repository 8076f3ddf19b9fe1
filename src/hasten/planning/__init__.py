"""Knowing before launch what a training run needs in memory (issue 39, in progress).

Today: ``step_memory`` measures the memory of training steps on one device, by category, on fake tensors (a
prediction: nothing is allocated, so any model size plans in seconds) or on real ones (a measurement), and
``sharded_memory`` does the same per rank under FSDP2 at any number of processes, on PyTorch's fake process group;
both with PyTorch's own trackers (``torch_tools``, the one module that touches PyTorch's private tools). The other
layouts (DDP, ZeRO, tensor parallelism), ``hasten plan`` and ``hasten.plan(...)`` build on them.
"""
from .sharded_memory import fsdp2_step_memory
from .step_memory import MemoryBreakdown, training_step_memory

__all__ = ["MemoryBreakdown", "training_step_memory", "fsdp2_step_memory"]
