"""How much memory each device has free right now (the default ``max_memory``)."""
from __future__ import annotations

import logging

import psutil
import torch

from ..core.aliases import Device
from ..state import accelerator_type  # noqa: F401  (re-exported for the planner's modules)

logger = logging.getLogger(__name__)


def accelerator_count() -> int:
    """Number of numbered accelerators (GPUs/XPUs); 0 on a CPU-only or MPS machine."""
    kind = accelerator_type()
    if kind in ("cuda", "xpu"):
        return getattr(torch, kind).device_count()
    return 0


def available_memory() -> dict:
    """Free bytes per device: ``{0: ..., 1: ..., "cpu": ...}`` (``{"mps": ...}`` on Apple silicon).

    Devices that share host RAM (MPS, integrated GPUs) get no separate ``"cpu"`` budget: counting the same RAM
    twice would plan more than fits.
    """
    kind = accelerator_type()
    memory: dict = {}
    shares_host_ram = False
    if kind in ("cuda", "xpu"):
        backend = getattr(torch, kind)
        for index in range(backend.device_count()):
            try:
                memory[index] = backend.mem_get_info(index)[0]
            except Exception as error:  # a broken or busy device: plan without it
                logger.info("Skipping %s:%d, which cannot report its free memory (%s).", kind, index, error)
                continue
            if kind == "cuda":
                shares_host_ram |= bool(getattr(torch.cuda.get_device_properties(index), "is_integrated", False))
    if kind == "mps":
        memory["mps"] = psutil.virtual_memory().available
    elif not shares_host_ram:
        memory["cpu"] = psutil.virtual_memory().available
    return memory


def empty_cache(device: Device) -> None:
    """Release cached blocks of ``device``'s allocator (no-op for the CPU, meta and the disk)."""
    kind = device if isinstance(device, str) else getattr(device, "type", None)
    if isinstance(device, int):
        kind = accelerator_type()
    elif isinstance(kind, str):
        kind = kind.split(":")[0]
    if kind in ("cuda", "xpu", "mps"):
        backend = getattr(torch, kind, None)
        if backend is not None and hasattr(backend, "empty_cache"):
            backend.empty_cache()
