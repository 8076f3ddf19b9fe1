"""Knowing before launch what a training run needs in memory (issue 39, in progress).

Today: ``step_memory`` measures the memory of training steps on one device, by category, on fake tensors (a
prediction: nothing is allocated, so any model size plans in seconds) or on real ones (a measurement), with
PyTorch's own tracker (``torch_tools``, the one module that touches PyTorch's private ``_tools``). The layouts
across processes (DDP, FSDP, ZeRO, tensor parallelism), ``hasten plan`` and ``hasten.plan(...)`` build on it.
"""
from .step_memory import MemoryBreakdown, training_step_memory

__all__ = ["MemoryBreakdown", "training_step_memory"]
