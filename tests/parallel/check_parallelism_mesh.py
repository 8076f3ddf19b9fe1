"""ParallelismConfig.build_device_mesh across 2 real processes (run by tests/utils/test_planned_surface.py).

Builds the mesh for FSDP-style sharding (dp_shard=2) and for tensor parallelism (tp=2), and checks that a data
loader prepared with each mesh splits the data over the data-parallel dimensions only. Prints MESH CHECKS PASSED.
"""
import torch.distributed as dist
from torch.utils.data import DataLoader

from hasten.data import prepare_data_loader
from hasten.parallelism_config import ParallelismConfig
from hasten.state import PartialState


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {dist.get_rank()}] {what}")


def seen_by_everyone(mesh) -> list:
    loader = prepare_data_loader(DataLoader(list(range(8)), batch_size=2), torch_device_mesh=mesh)
    mine = [int(i) for batch in loader for i in batch]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return gathered


def main():
    state = PartialState()
    check(state.num_processes == 2, "needs 2 processes")

    sharded = ParallelismConfig(dp_shard_size=2)
    mesh = sharded.get_device_mesh("cpu")
    check(mesh.mesh_dim_names == ("dp_shard",), f"dimensions {mesh.mesh_dim_names}")
    check(mesh["dp"].size() == 2 and mesh["dp_shard_cp"].size() == 2, "flattened dp / dp_shard_cp meshes")
    shares = seen_by_everyone(mesh)
    check(sorted(shares[0] + shares[1]) == list(range(8)) and not set(shares[0]) & set(shares[1]),
          f"dp_shard splits the data: {shares}")
    if state.is_main_process:
        print("ok: dp_shard mesh", flush=True)

    tensor_parallel = ParallelismConfig(tp_size=2)
    mesh = tensor_parallel.build_device_mesh("cpu")
    check(mesh.mesh_dim_names == ("tp",), f"dimensions {mesh.mesh_dim_names}")
    shares = seen_by_everyone(mesh)
    check(shares[0] == shares[1] == list(range(8)), f"tp ranks see the same data: {shares}")
    if state.is_main_process:
        print("ok: tp mesh", flush=True)

    try:
        ParallelismConfig(dp_shard_size=2, tp_size=2).build_device_mesh("cpu")
    except ValueError as error:
        check("does not match the number of processes" in str(error), str(error))
    else:
        check(False, "a mesh of 4 built with 2 processes")
    state.wait_for_everyone()
    if state.is_main_process:
        print("MESH CHECKS PASSED", flush=True)
    state.destroy_process_group()


if __name__ == "__main__":
    main()
