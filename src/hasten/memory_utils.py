"""Old import path ``accelerate.memory_utils``: its helpers are ``hasten.utils.memory``'s (``hasten/core/memory.py``).

Importing it warns (as the reference does) and still gives the two names it used to hold.
"""
import warnings

from .core.memory import find_executable_batch_size, release_memory

__all__ = ["find_executable_batch_size", "release_memory"]

warnings.warn(
    "hasten.memory_utils is an old import path: import find_executable_batch_size from hasten "
    "(`from hasten import find_executable_batch_size`) or from hasten.utils.memory.",
    FutureWarning,
    stacklevel=2,
)
