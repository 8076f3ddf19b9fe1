"""Accelerate's import path ``accelerate.utils.memory`` (``hasten/core/memory.py``)."""
from ..core.memory import (  # noqa: F401
    clear_device_cache,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)

__all__ = [
    "find_executable_batch_size", "release_memory", "clear_device_cache", "should_reduce_batch_size",
]
