"""The CPU memory allocator's policy for sharded training.

With glibc's default malloc, large buffers freed by a sharded backend (FSDP's gathered parameters and reduced
gradients, allocated and freed for every layer at every step) stay in the process heap instead of going back to
the system, because glibc raises its mmap threshold each time such a buffer is freed. A CPU FSDP run then peaks
above DDP's memory (1.23x here, bench/bench_fsdp.py). A fixed mmap threshold makes every buffer above it a
mapping of its own, returned when freed: FSDP2 then peaks at 0.57x of DDP. The price is a page fault per fresh
buffer (steps took 1.4-1.7x longer in that benchmark), so it is set only where memory is the point: CPU runs of
sharded strategies, and only when the user has not chosen (``MALLOC_MMAP_THRESHOLD_`` or
``HASTEN_CPU_MMAP_THRESHOLD``; 0 leaves the allocator alone).

``release_free_heap`` hands the heap pages already freed back to the system at once (``malloc_trim``), for code
that streams large tensors through a process (quantized loading) without changing the policy.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

__all__ = ["DEFAULT_MMAP_THRESHOLD", "limit_heap_retention", "release_free_heap"]

logger = logging.getLogger(__name__)

DEFAULT_MMAP_THRESHOLD = 64 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def limit_heap_retention() -> bool:
    """Set glibc's mmap threshold for this process (see the module docstring); returns whether it was set."""
    from .env_aliases import get_setting

    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False  # the user's own allocator policy
    threshold = get_setting("cpu_mmap_threshold", DEFAULT_MMAP_THRESHOLD, parse=_bytes)
    if threshold == 0:
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # not glibc (musl, macOS): nothing to set
        return False
    done = bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    if done:
        logger.debug("malloc mmap threshold set to %d bytes for sharded CPU training", threshold)
    return done


def release_free_heap() -> None:
    """Return the heap pages this process has freed to the system (glibc's ``malloc_trim``; elsewhere nothing)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _libc():
    """The C library (None when it cannot be loaded); dlopen of the already-loaded libc is a lookup."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _bytes(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(f"must be a number of bytes >= 0 (0 leaves the allocator alone), got {raw!r}")
    return value
