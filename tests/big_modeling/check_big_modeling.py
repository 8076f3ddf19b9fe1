"""Run with `hasten launch -n N` (N >= 2): checkpoint loading into DTensor-sharded and replicated models.

The expected weights come from a seeded plain-torch model built identically on every rank; only rank 0 writes
the checkpoint files.
"""
from __future__ import annotations

import gc
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from hasten.big_modeling import checkpoint_files, load_checkpoint_in_model
from hasten.state import PartialState


def reference_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))


def sharded_model(mesh) -> nn.Sequential:
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
    for module in (model[0], model[2]):
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, nn.Parameter(distribute_tensor(torch.zeros_like(param), mesh, [Shard(0)])))
    return model


def assert_loaded(model, reference, rank, world):
    for name, expected in reference.state_dict().items():
        value = model.state_dict()[name]
        if isinstance(value, DTensor):
            assert torch.equal(value.full_tensor(), expected), name
            local = value.to_local()
            rows = expected.shape[0] // world
            assert torch.equal(local, expected[rank * rows:(rank + 1) * rows]), name  # each rank holds its shard
        else:
            assert torch.equal(value, expected), name


def main():
    state = PartialState()
    rank, world = state.process_index, state.num_processes
    mesh = init_device_mesh("cpu", (world,))
    reference = reference_model()
    shared = [tempfile.mkdtemp(prefix="hasten-bm-") if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    folder = shared[0]
    if rank == 0:
        state_dict = reference.state_dict()
        save_file(state_dict, os.path.join(folder, "model.safetensors"))
        names = list(state_dict)
        shards = {"a.safetensors": names[:2], "b.safetensors": names[2:]}
        os.makedirs(os.path.join(folder, "sharded"))
        for shard, keys in shards.items():
            save_file({k: state_dict[k] for k in keys}, os.path.join(folder, "sharded", shard))
        weight_map = {k: shard for shard, keys in shards.items() for k in keys}
        with open(os.path.join(folder, "sharded", "model.safetensors.index.json"), "w") as handle:
            json.dump({"weight_map": weight_map}, handle)
        bad = dict(state_dict)
        bad["extra"] = torch.ones(1)
        save_file(bad, os.path.join(folder, "bad.safetensors"))
    dist.barrier()
    checkpoint = os.path.join(folder, "model.safetensors")

    # 1. every rank reads the full checkpoint and keeps its own shard
    model = sharded_model(mesh)
    load_checkpoint_in_model(model, checkpoint)
    assert_loaded(model, reference, rank, world)

    # 2. only rank 0 reads: the others get a path that does not exist and must never open a file
    if rank != 0:
        def refuse(*args, **kwargs):
            raise AssertionError("a rank other than 0 opened the checkpoint")

        checkpoint_files.SafetensorsFile.tensors = refuse
    for source in (checkpoint, os.path.join(folder, "sharded")):
        model = sharded_model(mesh)
        load_checkpoint_in_model(model, source if rank == 0 else "/nonexistent/checkpoint", broadcast_from_rank0=True)
        assert_loaded(model, reference, rank, world)

    # 3. a plain (replicated) model gets rank 0's values everywhere
    plain = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
    load_checkpoint_in_model(plain, checkpoint if rank == 0 else "/nonexistent/checkpoint", broadcast_from_rank0=True)
    assert_loaded(plain, reference, rank, world)

    # 4. a bad checkpoint raises on every rank (no rank is left waiting in a collective)
    try:
        load_checkpoint_in_model(sharded_model(mesh), os.path.join(folder, "bad.safetensors"), strict=True,
                                 broadcast_from_rank0=True)
    except ValueError as error:
        assert "extra" in str(error), error
    else:
        raise AssertionError("strict mismatch was not reported")

    state.wait_for_everyone()
    if rank == 0:
        print(f"check_big_modeling OK on {world} processes", flush=True)


def run():
    main()
    # DTensors and the device mesh hold the process group: free them before destroying it, or gloo's threads may
    # be torn down during interpreter exit (an intermittent abort after all checks passed)
    gc.collect()
    PartialState().destroy_process_group()


if __name__ == "__main__":
    run()
