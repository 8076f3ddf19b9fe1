"""ParallelDims across real processes (gloo, CPU), run by tests/parallel/test_parallel_dims.py on 2 and on 4 processes.

For every valid shape of this world size: build the DeviceMesh, check its dimension names and sizes and the flattened
``dp`` / ``dp_shard_cp`` / ``dp_cp`` dimensions, check that the ranks computed from the global rank are the mesh's
coordinates, and that an all_reduce over ``dp_group`` sums over the data-parallel ranks only. Invalid shapes must
raise on every rank. Prints ``PARALLEL DIMS CHECKS PASSED world=N shapes=M``.
"""
import itertools
import math

import torch
import torch.distributed as dist

from hasten.parallel.config import check_size_combination
from hasten.parallel import ParallelDims, ParallelismConfig
from hasten.state import PartialState

ORDER = ("dp_replicate", "dp_shard", "cp", "tp")


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {dist.get_rank()}] {what}")


def valid_shapes(world: int) -> list:
    """Every (dp_replicate, dp_shard, cp, tp) whose product is ``world`` and that ParallelismConfig accepts."""
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    shapes = []
    for shape in itertools.product(divisors, repeat=len(ORDER)):
        if math.prod(shape) != world:
            continue
        try:
            check_size_combination(**{f"{name}_size": size for name, size in zip(ORDER, shape)})
        except ValueError:
            continue
        shapes.append(dict(zip(ORDER, shape)))
    return shapes


def dp_sum_expected(dims: ParallelDims) -> int:
    """The sum of the global ranks that share this rank's cp and tp coordinates (its data-parallel peers)."""
    mine = dims.coordinates()
    return sum(rank for rank in range(dims.world_size)
               if all(dims.coordinates(rank)[name] == mine[name] for name in ("cp", "sp", "tp")))


def check_shape(sizes: dict, world: int, rank: int) -> None:
    config = ParallelismConfig(**{f"{name}_size": size for name, size in sizes.items()})
    dims = ParallelDims.from_config(config, world)
    label = f"shape {sizes}"
    check(dims.global_rank == rank, f"{label}: global rank {dims.global_rank}")
    mesh = dims.build_mesh("cpu")
    check(dims.build_mesh("cpu") is mesh and dims.mesh is mesh, f"{label}: the mesh is built once")
    check(config.get_device_mesh("cpu") is mesh, f"{label}: the config shares the mesh")
    expected_names = tuple(name for name in ORDER if sizes[name] > 1)
    check(mesh.mesh_dim_names == expected_names, f"{label}: dimensions {mesh.mesh_dim_names}")
    check(tuple(mesh.shape) == tuple(sizes[name] for name in expected_names), f"{label}: shape {mesh.shape}")
    check(mesh.device_type == "cpu", f"{label}: device {mesh.device_type}")
    coordinate = dict(zip(expected_names, mesh.get_coordinate()))
    arithmetic = dims.coordinates()
    for name in expected_names:
        check(coordinate[name] == arithmetic[name] == dims.submesh(name).get_local_rank(),
              f"{label}: {name} coordinate mesh {coordinate[name]} vs arithmetic {arithmetic[name]}")
    for name in ORDER:
        if name not in expected_names:
            check(arithmetic[name] == 0, f"{label}: {name} of size 1 has coordinate {arithmetic[name]}")
    check((dims.tp_rank, dims.cp_rank, dims.dp_shard_rank, dims.dp_replicate_rank)
          == (arithmetic["tp"], arithmetic["cp"], arithmetic["dp_shard"], arithmetic["dp_replicate"]),
          f"{label}: rank properties")
    for joint, parts in (("dp", ("dp_replicate", "dp_shard")), ("dp_shard_cp", ("dp_shard", "cp")),
                         ("dp_cp", ("dp_replicate", "dp_shard", "cp"))):
        size = math.prod(sizes[name] for name in parts)
        if any(sizes[name] > 1 for name in parts):
            flat = dims.submesh(joint)
            check(flat.size() == size and flat.mesh_dim_names == (joint,), f"{label}: {joint} has {flat.size()} ranks")
            local = 0
            for name in parts:
                local = local * sizes[name] + arithmetic[name]
            check(flat.get_local_rank() == local, f"{label}: {joint} local rank")
        else:
            check(joint not in dims.flattened_dim_names, f"{label}: {joint} of size 1 is flattened")
            try:
                dims.submesh(joint)
            except KeyError:
                pass
            else:
                check(False, f"{label}: the mesh has a {joint} dimension of size 1")
    check(dims.submesh("dp").get_local_rank() == dims.dp_rank if dims.dp_size > 1 else dims.dp_rank == 0,
          f"{label}: dp_rank {dims.dp_rank}")
    check(dims.dp_size == sizes["dp_replicate"] * sizes["dp_shard"], f"{label}: dp_size {dims.dp_size}")

    group = dims.dp_group
    check((group is None) == (dims.dp_size == world), f"{label}: dp_group {group}")
    if group is not None:
        check(dist.get_world_size(group) == dims.dp_size, f"{label}: dp_group has {dist.get_world_size(group)}")
    value = torch.tensor([float(rank)])
    dist.all_reduce(value, group=group)
    check(value.item() == dp_sum_expected(dims), f"{label}: all_reduce over dp gave {value.item()}, expected "
                                                 f"{dp_sum_expected(dims)}")


def check_plain_data_parallel(world: int, rank: int) -> None:
    for dims in (ParallelDims.from_config(None, world), ParallelDims.from_config(ParallelismConfig(), world)):
        check((dims.dp_replicate, dims.dp_size, dims.dp_rank) == (world, world, rank), f"plain DDP: {dims}")
        check(not dims.uses_mesh and dims.dp_group is None and not dims.mesh_built, "plain DDP needs no mesh")
        mesh = dims.build_mesh("cpu")
        check(mesh.mesh_dim_names == ("dp_replicate",) and dims.submesh("dp").size() == world, f"1-D mesh {mesh}")
        check(list(mesh.get_coordinate()) == [rank], f"1-D mesh coordinate {mesh.get_coordinate()}")
        try:
            dims.build_mesh("cuda")
        except ValueError as error:
            check("built for 'cpu'" in str(error), str(error))
        else:
            check(False, "a mesh built for cpu returned for cuda")


def check_invalid_shapes(world: int) -> None:
    outcomes = []
    for sizes in ({"dp_shard_size": world * 2}, {"dp_shard_size": 2, "tp_size": world}, {"tp_size": 3}):
        try:
            ParallelDims.from_config(ParallelismConfig(**sizes), world)
        except ValueError as error:
            text = str(error)
            outcomes.append(f"the job has {world} processes (WORLD_SIZE={world})" in text
                            and "does not match" in text)
        else:
            outcomes.append(False)
    try:  # a layout of another size than the job: refused before init_device_mesh
        ParallelDims(dp_shard=world * 2, world_size=world * 2, rank=0).build_mesh("cpu")
    except ValueError as error:
        outcomes.append(f"the job has {world} processes" in str(error))
    else:
        outcomes.append(False)
    everyone = [None] * world
    dist.all_gather_object(everyone, outcomes)
    check(all(all(result) for result in everyone), f"invalid shapes must raise on every rank: {everyone}")


def main():
    state = PartialState()
    world, rank = state.num_processes, state.process_index
    check(world in (2, 4), f"run on 2 or 4 processes, not {world}")
    check_plain_data_parallel(world, rank)
    shapes = valid_shapes(world)
    for sizes in shapes:
        check_shape(sizes, world, rank)
        if state.is_main_process:
            print(f"ok: {sizes}", flush=True)
    check_invalid_shapes(world)
    state.wait_for_everyone()
    if state.is_main_process:
        print(f"PARALLEL DIMS CHECKS PASSED world={world} shapes={len(shapes)}", flush=True)
    state.destroy_process_group()


if __name__ == "__main__":
    main()
