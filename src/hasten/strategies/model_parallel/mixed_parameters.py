"""Optimizers over a tensor-parallel model whose parameters are partly DTensors (the split layers) and partly plain
tensors (what the plan leaves whole, when no data-parallel sharding turns them into DTensors too).

PyTorch's multi-tensor (``foreach``) and fused optimizer steps, the default on a GPU, cannot take one list that mixes
the two kinds ("got mixed torch.Tensor and DTensor" at the first ``step``). ``per_tensor_where_mixed`` makes each
parameter group that mixes them step tensor by tensor: silently where the group left the choice to PyTorch, with one
warning where the user asked for ``foreach=True`` (the step would fail otherwise). A ``fused=True`` group is left to
fail loudly in PyTorch: fused kernels have no per-tensor fallback that computes the same numbers.
"""
from __future__ import annotations

import warnings

import torch

__all__ = ["per_tensor_where_mixed"]


def _mixes_kinds(parameters: list) -> bool:
    from torch.distributed.tensor import DTensor

    kinds = {isinstance(parameter, DTensor) for parameter in parameters}
    return len(kinds) == 2


def per_tensor_where_mixed(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer`` with ``foreach=False`` in each group that mixes DTensors and plain tensors (see the module
    docstring); returns the same optimizer."""
    for group in getattr(optimizer, "param_groups", []):
        if "foreach" not in group or group.get("fused") or not _mixes_kinds(list(group["params"])):
            continue
        if group["foreach"]:
            warnings.warn(f"{type(optimizer).__name__}(foreach=True) cannot step DTensor and plain-tensor parameters "
                          "in one list (tensor parallelism without data-parallel sharding leaves the unsplit layers "
                          "plain): this group steps tensor by tensor.", stacklevel=3)
        group["foreach"] = False
    return optimizer
