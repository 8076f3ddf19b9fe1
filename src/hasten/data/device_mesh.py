"""Which share of the data a process takes when a ``DeviceMesh`` describes the parallelism.

Only the data-parallel dimensions of the mesh split the data; the ranks along the others (tensor, context,
pipeline parallel) work on the same batches. The process's share is its coordinate along the data-parallel
dimensions, whatever their order in the mesh.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["DATA_PARALLEL_DIMS", "SAME_DATA_DIMS", "data_parallel_layout"]

DATA_PARALLEL_DIMS = ("dp", "dp_replicate", "dp_shard", "fsdp", "ddp", "hsdp")
SAME_DATA_DIMS = ("tp", "cp", "pp", "sp")


def data_parallel_layout(mesh: DeviceMesh) -> tuple[int, int]:
    """``(number of data shards, this process's shard)`` for a ``torch.distributed.DeviceMesh``."""
    names = getattr(mesh, "mesh_dim_names", None)
    if not names:
        raise ValueError(
            "torch_device_mesh must have named dimensions so the data-parallel ones can be found: build it with "
            f"init_device_mesh(..., mesh_dim_names=(...)) using names among {DATA_PARALLEL_DIMS + SAME_DATA_DIMS}."
        )
    unknown = [name for name in names if name not in DATA_PARALLEL_DIMS + SAME_DATA_DIMS]
    if unknown:
        raise ValueError(
            f"torch_device_mesh has dimension(s) {unknown} whose role is unknown: name data-parallel dimensions "
            f"among {DATA_PARALLEL_DIMS} (they split the data) and the others among {SAME_DATA_DIMS} (their ranks "
            "get the same data)."
        )
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError("This process is not part of torch_device_mesh: every process must belong to the mesh.")
    shards, shard = 1, 0
    for dim, (name, position) in enumerate(zip(names, coordinate)):
        if name in DATA_PARALLEL_DIMS:
            extent = mesh.size(dim)
            shard = shard * extent + position
            shards *= extent
    return shards, shard
