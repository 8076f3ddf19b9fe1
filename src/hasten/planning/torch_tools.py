"""The one door to PyTorch's private planning tools (``torch.distributed._tools``' memory trackers, the fake process
group), checked once.

``MemTracker`` attributes every live tensor storage to the module and the category it belongs to (parameters,
buffers, gradients, optimizer state, activations, temporaries) and keeps the peak; it works the same on real and on
fake tensors (``FakeTensorMode``), which is what lets a plan predict without allocating. Its API is private to
PyTorch, so nothing else in hasten imports it: when a PyTorch release moves or changes it, this module raises one
clear error (tests/planning checks the categories it reports on every supported PyTorch).
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["MEMORY_CATEGORIES", "memory_tracker", "sharded_memory_tracker", "peak_by_category", "fake_store"]

#: PyTorch's category names (``_MemRefType``, ``_FSDPRefType``) -> hasten's field names (``MemoryBreakdown``)
MEMORY_CATEGORIES = {"PARAM": "parameters", "BUFFER": "buffers", "GRAD": "gradients", "OPT": "optimizer_state",
                     "ACT": "activations", "TEMP": "temporaries", "OTH": "other",
                     # FSDP2's: this rank's shards, the parameters gathered for a unit's compute, the gathered
                     # gradients before they are reduced, the collectives' buffers, the inputs
                     "SHARDED_PARAM": "parameters", "UNSHARDED_PARAM": "gathered_parameters",
                     "SHARDED_GRAD": "gradients", "UNSHARDED_GRAD": "gathered_gradients",
                     "ALL_GATHER": "communication", "REDUCE_SCATTER": "communication", "INP": "activations"}
_FIELDS = tuple(dict.fromkeys(MEMORY_CATEGORIES.values()))


def memory_tracker() -> Any:
    """A fresh ``torch.distributed._tools.mem_tracker.MemTracker``; a clear error when this PyTorch has none."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as error:  # moved or removed in this PyTorch
        raise RuntimeError(f"Planning memory needs PyTorch's MemTracker (torch.distributed._tools.mem_tracker), "
                           f"which torch {torch.__version__} does not have: {error}") from None
    return MemTracker()


def sharded_memory_tracker(model: Any, optimizer: Any) -> Any:
    """A fresh ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` of a model sharded with
    ``fully_shard``; a clear error when this PyTorch has none."""
    try:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    except ImportError as error:
        raise RuntimeError(f"Planning sharded memory needs PyTorch's FSDPMemTracker "
                           f"(torch.distributed._tools.fsdp2_mem_tracker), which torch {torch.__version__} does not "
                           f"have: {error}") from None
    return FSDPMemTracker(model, optimizer)


def fake_store() -> Any:
    """The store PyTorch's fake process group (backend ``"fake"``) is initialised with."""
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as error:
        raise RuntimeError(f"Planning at a number of processes needs PyTorch's fake process group "
                           f"(torch.testing._internal.distributed.fake_pg), which torch {torch.__version__} does not "
                           f"have: {error}") from None
    return FakeStore()


def peak_by_category(tracker: Any) -> dict[str, int]:
    """``{field: bytes}`` at the moment of the tracker's peak, summed over devices (one device here)."""
    totals = {field: 0 for field in _FIELDS}
    for categories in tracker.get_tracker_snapshot("peak").values():
        for category, size in categories.items():
            name = getattr(category, "name", str(category))
            if name == "Total":
                continue
            if name not in MEMORY_CATEGORIES:
                raise RuntimeError(f"PyTorch's MemTracker reports a memory category hasten does not know ({name!r}, "
                                   f"torch {torch.__version__}): planning cannot attribute it.")
            totals[MEMORY_CATEGORIES[name]] += int(size)
    return totals
