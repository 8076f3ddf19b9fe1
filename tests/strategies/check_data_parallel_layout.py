"""The data-parallel layout drives data sharding, gathers, reductions and the loss normalisation (2 processes).

Run by tests/strategies/test_strategy_seam.py under ``hasten launch -n 2``:

1. ``ParallelismConfig(dp_replicate_size=2)``: DDP over the run's one DeviceMesh (``torch_device_mesh``), the same
   data split and results as without a config;
2. ``ParallelismConfig(sp_size=2)`` without DeepSpeed (its backend): a ValueError on every process;
3. a stand-in model-parallel strategy whose layout is ``tp=2`` (both processes are one data-parallel rank, each
   holding a whole replica): both processes get every batch, ``gather_for_metrics`` / ``gather`` / ``reduce`` count
   each sample once, ``num_items_in_batch`` is normalised over the data-parallel size (1), not over 2 processes;
4. a stand-in sharded checkpoint IO writing one file per rank into the staging folder: the transaction's marker
   lists both ranks' files, each rank reads its own back, and a missing rank file refuses the load on every rank.

Prints LAYOUT CHECKS PASSED.
"""
import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from hasten import Accelerator, ParallelismConfig
from hasten.checkpointing import CheckpointError
from hasten.checkpointing.checkpoint_io import FullStateCheckpointIO
from hasten.parallel import ParallelDims
from hasten.state import AcceleratorState
from hasten.strategies import DDPStrategy


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {torch.distributed.get_rank()}] {what}")


def batches_seen(accelerator, loader) -> list:
    return [int(i) for batch in accelerator.prepare(loader) for i in batch]


def replicated_config() -> None:
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_replicate_size=2))
    mesh = accelerator.torch_device_mesh
    check(mesh is not None and mesh.mesh_dim_names == ("dp_replicate",), f"mesh {mesh}")
    check(accelerator.data_parallel_rank == accelerator.process_index, "dp rank is the process index")
    seen = batches_seen(accelerator, DataLoader(list(range(8)), batch_size=2))
    everyone = accelerator.gather_for_metrics(seen, use_gather_object=True)
    check(sorted(everyone) == list(range(8)) and len(seen) == 4, f"data split over dp_replicate: {everyone}")
    model = accelerator.prepare(nn.Linear(3, 1))
    check(isinstance(model, nn.parallel.DistributedDataParallel), f"pure replication trains with DDP: {type(model)}")
    print("ok: dp_replicate config trains with DDP over the run's mesh", flush=True)


def unbuilt_backend_refused() -> None:
    try:
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(sp_size=2))
    except ValueError as error:  # sequence parallelism is DeepSpeed's (ALST / Ulysses)
        check("sp_size=2" in str(error) and "needs DeepSpeed" in str(error), str(error))
    else:
        check(False, "sp_size=2 without DeepSpeed was accepted")
    print("ok: sp_size=2 refused without its backend, DeepSpeed", flush=True)


class ReplicaPerTensorRank(DDPStrategy):
    """Stand-in for a tensor-parallel backend: layout tp=2, each process keeps a whole (unsharded) replica."""


def model_parallel_layout() -> None:
    accelerator = Accelerator(cpu=True)
    stand_in = ReplicaPerTensorRank(accelerator.state, accelerator.strategy.settings,
                                    ParallelDims(tp=2, world_size=accelerator.num_processes))
    accelerator.strategy = accelerator._accumulator.strategy = stand_in
    rank = accelerator.process_index
    check(accelerator.data_parallel_rank == 0 and accelerator.tensor_parallel_rank == rank,
          f"ranks dp={accelerator.data_parallel_rank} tp={accelerator.tensor_parallel_rank}")

    seen = batches_seen(accelerator, DataLoader(list(range(10)), batch_size=4))
    check(seen == list(range(10)), f"one data-parallel rank: every process gets every batch, got {seen}")

    loader = accelerator.prepare(DataLoader(torch.arange(10), batch_size=4))
    gathered = torch.cat([accelerator.gather_for_metrics(batch) for batch in loader])
    check(gathered.tolist() == list(range(10)), f"gather_for_metrics counts each sample once: {gathered.tolist()}")
    check(accelerator.gather(torch.tensor([rank])).tolist() == [rank], "gather over the data-parallel group")
    check(accelerator.reduce(torch.tensor(5.0)).item() == 5.0, "reduce sums over the data-parallel group only")

    weight = nn.Parameter(torch.ones(1))
    accelerator.backward((weight * 3.0).sum(), num_items_in_batch=3)
    check(torch.allclose(weight.grad, torch.ones(1)), f"loss normalised over dp size 1: grad {weight.grad}")
    print("ok: a model-parallel layout shards, gathers, reduces and normalises over data-parallel ranks", flush=True)


class OneFilePerRank(FullStateCheckpointIO):
    """Stand-in for a sharded backend's IO: each rank also writes and reads a file of its own."""

    def write(self, staging, collected, *, writes_shared_files, process_index, safe_serialization=True,
              process_group=None):
        super().write(staging, collected, writes_shared_files=writes_shared_files,
                      process_index=process_index, safe_serialization=safe_serialization)
        (staging / "shards").mkdir(exist_ok=True)
        torch.save({"rank": process_index}, staging / "shards" / f"rank_{process_index}.pt")

    def read(self, strategy, folder, marker, targets, **kwargs):
        rank = torch.distributed.get_rank()
        mine = torch.load(folder / "shards" / f"rank_{rank}.pt", weights_only=True)
        check(mine == {"rank": rank}, f"read back {mine}")
        return super().read(strategy, folder, marker, targets, **kwargs)


def sharded_checkpoint_io(work: Path) -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.strategy.checkpoint_io = OneFilePerRank()
    model = nn.Linear(3, 2)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    folder = Path(accelerator.save_state(work / "per_rank"))
    accelerator.wait_for_everyone()  # process 1 adds its files to the main process's checkpoint (contributions.py)
    marker = json.loads((folder / "hasten_checkpoint.json").read_text())
    added = json.loads((folder / "hasten_process_1.json").read_text())
    check("shards/rank_0.pt" in marker["files"] and "shards/rank_1.pt" in added["files"],
          f"the marker lists {sorted(marker['files'])}, process 1's record {sorted(added['files'])}")
    accelerator.load_state(folder)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (folder / "shards" / "rank_1.pt").unlink()
    accelerator.wait_for_everyone()
    try:
        accelerator.load_state(folder)
    except CheckpointError as error:
        check("rank_1.pt" in str(error), str(error))
    else:
        check(False, "a checkpoint missing a rank's file was loaded")
    print("ok: a strategy's per-rank files are written, listed (the marker, the process's record), read and checked",
          flush=True)


def main(work: Path) -> None:
    replicated_config()
    AcceleratorState._reset_state()
    unbuilt_backend_refused()
    AcceleratorState._reset_state()
    model_parallel_layout()
    AcceleratorState._reset_state()
    sharded_checkpoint_io(work)
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        print("LAYOUT CHECKS PASSED", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
