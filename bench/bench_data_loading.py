"""Data loading: hasten vs plain PyTorch vs Accelerate, side by side.

    python bench/bench_data_loading.py          # all three benchmarks (the first two launch 2 processes)

1. Per-batch cost of a prepared loader, 2 processes: plain ``DataLoader`` + ``DistributedSampler`` (the
   baseline) vs ``prepare_data_loader`` vs Accelerate's. Target: <= 1.02x the baseline, and not slower than
   Accelerate.
2. Dispatch (process 0 reads, every process receives its share), 2 processes: time per batch, hasten vs
   Accelerate (baseline), i.e. the inverse of the throughput in batches/s.
3. Time to the first batch after resuming at batch 10^3, 10^4 and 10^5 (one process): reading and dropping
   batches (plain PyTorch), ``skip_first_batches`` and ``load_state_dict`` (hasten, plain and
   StatefulDataLoader-backed), and Accelerate's ``skip_first_batches``. Flat in the position means O(1).
4. The model-free loop (issue 10, item 6a): 4,000 batches of 64 x 16 floats per process and epoch, loaders
   prepared as ``Accelerator.prepare`` does (``put_on_device=True`` on the CPU, ``rng_types=["generator"]``),
   epochs after the first one, the variants alternating (paired) for ``BENCH_PAIRS`` (default 30) pairs.
   Reported: median per-pair ratio over ``DataLoader`` + ``DistributedSampler`` (target <= 1.02x), with
   2 processes (the slower rank's epoch time) and, less sensitive to a shared machine, in one process
   (simulating process 0 of 2) with the per-batch overhead in microseconds, also with a dataset that hands
   out a ready batch (what remains is the loaders' own per-batch cost).

    python bench/bench_data_loading.py --only model-free   # only 4 (one 2-process launch, about 2 minutes)

``main()`` returns the rows of all four (``bench/run_all.py`` collects them).
"""
from __future__ import annotations

import fcntl
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
from harness import compare, format_table, is_installed  # noqa: E402

LOCK = Path(os.environ.get("HASTEN_TEST_LOCK", "/tmp/hasten-multiprocess-tests.lock"))
PROCESSES = 2


# --------------------------------------------------------------------------------------------- 2 processes
def _timed_epoch(loader, before=None):
    """A variant: one epoch after a barrier; returns seconds per batch."""
    import time

    import torch.distributed as dist

    def run():
        if before is not None:
            before()
        dist.barrier()
        start = time.perf_counter()
        count = 0
        for _ in loader:
            count += 1
        return (time.perf_counter() - start) / max(count, 1)

    return run


def _distributed_rows() -> list:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

    from hasten.data import prepare_data_loader
    from hasten.state import PartialState

    state = PartialState()
    rank, world = state.process_index, state.num_processes
    reference = None
    if is_installed("accelerate"):
        from accelerate.data_loader import prepare_data_loader as reference
        from accelerate.state import PartialState as ReferenceState

        ReferenceState(cpu=True)  # Accelerate goes multi-process on CPU only when told cpu=True
    rows = []

    # 1. per-batch overhead over DataLoader + DistributedSampler
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(32 * 400 * world, 32), torch.randint(0, 10, (32 * 400 * world,)))
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    plain = DataLoader(dataset, batch_size=32, sampler=sampler)
    epochs = itertools.count()
    ours = prepare_data_loader(DataLoader(dataset, batch_size=32, shuffle=True))
    variants = {"torch": _timed_epoch(plain, before=lambda: sampler.set_epoch(next(epochs))),
                "hasten": _timed_epoch(ours),
                "accelerate": reference and _timed_epoch(reference(DataLoader(dataset, batch_size=32, shuffle=True),
                                                                   num_processes=world, process_index=rank))}
    rows += compare(f"per-batch time of a prepared loader, {world} processes (400 batches of 32 per epoch)",
                    variants, repeats=15, warmup=2, show=rank == 0)

    # 2. dispatch: process 0 reads, the others receive
    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(32 * 200 * world):
                yield torch.full((128,), float(i)), i

    for split in (False, True):
        loader = DataLoader(Stream(), batch_size=32 if not split else 32 * world)
        ours = prepare_data_loader(loader, dispatch_batches=True, split_batches=split, put_on_device=True)
        theirs = reference and reference(DataLoader(Stream(), batch_size=32 if not split else 32 * world),
                                         dispatch_batches=True, split_batches=split, put_on_device=True,
                                         device=torch.device("cpu"))
        rows += compare(f"dispatch, {world} processes, split_batches={split} (seconds per batch; "
                        "1 / value = batches/s)",
                        {"hasten": _timed_epoch(ours), "accelerate": _timed_epoch(theirs) if theirs is not None else None},
                        repeats=9, warmup=1, baseline="accelerate", show=rank == 0)
    dist.barrier()
    return rows


# --------------------------------------------------------------------------------------------- model-free loop
MODEL_FREE_BATCHES, MODEL_FREE_BATCH, MODEL_FREE_FEATURES = 4000, 64, 16


class _ReadyBatches:
    """A map-style dataset whose every batch is the same ready tensor (``__getitems__``, no collation): what is
    left of an epoch's time is the loader's own per-batch overhead."""

    def __init__(self, length: int):
        import torch

        self.length, self.batch = length, [torch.zeros(MODEL_FREE_BATCH, MODEL_FREE_FEATURES)]

    def __len__(self) -> int:
        return self.length

    def __getitems__(self, indices):
        return self.batch


def _as_is(batch):
    return batch


def _model_free_loaders(num_processes: int, process_index: int, device, ready_batches: bool = False) -> dict:
    """The variants of scenario 4: name -> function running one epoch and returning (seconds, batches)."""
    import time

    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from hasten.data import prepare_data_loader

    torch.manual_seed(0)
    samples = MODEL_FREE_BATCH * MODEL_FREE_BATCHES * num_processes
    if ready_batches:
        dataset, options = _ReadyBatches(samples), {"collate_fn": _as_is}
    else:
        dataset, options = TensorDataset(torch.randn(samples, MODEL_FREE_FEATURES)), {}
    sampler = DistributedSampler(dataset, num_replicas=num_processes, rank=process_index, shuffle=True, seed=0)
    plain = DataLoader(dataset, batch_size=MODEL_FREE_BATCH, sampler=sampler, **options)
    ours = prepare_data_loader(DataLoader(dataset, batch_size=MODEL_FREE_BATCH, shuffle=True, **options),
                               device=device, num_processes=num_processes, process_index=process_index,
                               put_on_device=True, rng_types=["generator"])
    theirs = None
    if is_installed("accelerate"):
        from accelerate import Accelerator
        from accelerate.data_loader import prepare_data_loader as reference

        Accelerator(cpu=True)  # its rng synchronisation needs the AcceleratorState an Accelerator sets up
        theirs = reference(DataLoader(dataset, batch_size=MODEL_FREE_BATCH, shuffle=True, **options), device=device,
                           num_processes=num_processes, process_index=process_index, put_on_device=True,
                           rng_types=["generator"])
    epochs = itertools.count()

    def epoch(loader, before=None):
        def run():
            if before is not None:
                before()
            count = 0
            start = time.perf_counter()
            for _ in loader:
                count += 1
            return time.perf_counter() - start, count
        return run

    variants = {"torch": epoch(plain, before=lambda: sampler.set_epoch(next(epochs))), "hasten": epoch(ours)}
    if theirs is not None:
        variants["accelerate"] = epoch(theirs)
    return variants


def _paired(benchmark: str, variants: dict, pairs: int, slowest=None, show: bool = True) -> list:
    """Run the variants in alternating order ``pairs`` times after one untimed epoch each; rows with the
    median seconds per batch and the median of the per-pair ratios to "torch" (``slowest`` turns one rank's
    seconds into the slowest rank's)."""
    import statistics

    for run in variants.values():
        run()  # the first epoch: excluded, as in the issue ("second epoch")
    names = list(variants)
    per_batch = {name: [] for name in names}
    for index in range(pairs):
        order = names if index % 2 == 0 else names[::-1]
        for name in order:
            seconds, count = variants[name]()
            if slowest is not None:
                seconds = slowest(seconds)
            per_batch[name].append(seconds / max(count, 1))
    rows = []
    for name in names:
        ratios = [ours / base for ours, base in zip(per_batch[name], per_batch["torch"])]
        overhead = statistics.median(o - b for o, b in zip(per_batch[name], per_batch["torch"]))
        rows.append({"benchmark": benchmark, "variant": name, "median_s": statistics.median(per_batch[name]),
                     "min_s": min(per_batch[name]), "repeats": pairs, "ratio": statistics.median(ratios),
                     "note": "baseline" if name == "torch" else
                     f"median per-pair ratio; {overhead * 1e6:+.2f} us/batch"})
    if show:
        print(format_table(rows), flush=True)
    return rows


def _pairs() -> int:
    return int(os.environ.get("BENCH_PAIRS", 30))


def _model_free_single_rows() -> list:
    """Scenario 4 in one process (process 0 of 2 simulated): the per-batch Python overhead, little noise."""
    import torch

    rows = _paired(f"model-free loop, 1 process as rank 0 of {PROCESSES} ({MODEL_FREE_BATCHES:,} batches of "
                   f"{MODEL_FREE_BATCH}x{MODEL_FREE_FEATURES} floats, seconds per batch)",
                   _model_free_loaders(PROCESSES, 0, torch.device("cpu")), _pairs())
    rows += _paired(f"loader overhead alone, 1 process as rank 0 of {PROCESSES} (same loop, the dataset hands "
                    "out a ready batch: no indexing, no collation)",
                    _model_free_loaders(PROCESSES, 0, torch.device("cpu"), ready_batches=True), _pairs())
    return rows


def _model_free_distributed_rows() -> list:
    """Scenario 4 with real processes: each epoch's time is the slowest rank's."""
    import torch
    import torch.distributed as dist

    from hasten.state import PartialState

    state = PartialState()
    variants = _model_free_loaders(state.num_processes, state.process_index, state.device)

    def synchronised(run):
        def timed():
            dist.barrier()
            return run()
        return timed

    def slowest(seconds: float) -> float:
        value = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value.item())

    rows = _paired(f"model-free loop, {state.num_processes} processes ({MODEL_FREE_BATCHES:,} batches of "
                   f"{MODEL_FREE_BATCH}x{MODEL_FREE_FEATURES} floats per process, seconds per batch)",
                   {name: synchronised(run) for name, run in variants.items()}, _pairs(), slowest=slowest,
                   show=state.process_index == 0)
    dist.barrier()
    return rows


def _launch_distributed(scenario: str = "all") -> list:
    """Run the 2-process scenarios on 2 processes (one multi-process job on this machine at a time)."""
    with tempfile.TemporaryDirectory(prefix="hasten-bench-data-") as folder:
        output = Path(folder) / "rows.json"
        command = [sys.executable, "-m", "hasten", "launch", "-n", str(PROCESSES), __file__, "--rows-file",
                   str(output), "--only", scenario]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                        os.environ.get("PYTHONPATH")])))
        with open(LOCK, "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            code = subprocess.call(command, env=env)
        if code != 0 or not output.exists():
            raise RuntimeError(f"the 2-process data benchmark failed (exit status {code})")
        return json.loads(output.read_text())


# --------------------------------------------------------------------------------------------- resume
def _resume_rows() -> list:
    import torch
    from torch.utils.data import DataLoader, Dataset

    from hasten.data import prepare_data_loader, skip_first_batches

    class Indices(Dataset):
        def __len__(self):
            return 2**20

        def __getitem__(self, index):
            return index

    def loader():
        return DataLoader(Indices(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))

    reference = None
    if is_installed("accelerate"):
        from accelerate.data_loader import prepare_data_loader as reference_prepare
        from accelerate.data_loader import skip_first_batches as reference_skip

        reference = reference_prepare(loader(), num_processes=1, process_index=0)
    ours = prepare_data_loader(loader())
    stateful = prepare_data_loader(loader(), use_stateful_dataloader=True) if is_installed("torchdata") else None
    rows = []
    for position in (10**3, 10**4, 10**5):
        state = None
        if stateful is not None:
            iterator = iter(stateful)
            for _ in range(position):
                next(iterator)
            state = stateful.state_dict()
            del iterator
        plain = loader()
        variants = {
            "torch": lambda: next(itertools.islice(iter(plain), position, None)),
            "hasten skip_first_batches": lambda: next(iter(skip_first_batches(ours, position))),
            "hasten load_state_dict": lambda: (ours.load_state_dict({"epoch": 0, "batches_yielded": position}),
                                               next(iter(ours))),
            "hasten stateful load_state_dict": state and (lambda: (stateful.load_state_dict(state),
                                                                   next(iter(stateful)))),
            "accelerate skip_first_batches": reference and (lambda: next(iter(reference_skip(reference, position)))),
        }
        rows += compare(f"first batch after resuming at batch {position:,} (1 process, 2^20 samples, batch 8)",
                        variants, repeats=3 if position >= 10**5 else 5, warmup=0)
    return rows


def main(only: str = "all") -> list:
    if only == "model-free":
        return _model_free_single_rows() + _launch_distributed("model-free")
    rows = _resume_rows()
    rows += _model_free_single_rows()
    rows += _launch_distributed()
    return rows


def _only() -> str:
    return sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else "all"


if __name__ == "__main__":
    if "LOCAL_RANK" in os.environ:  # a rank of the 2-process part
        rows_file = Path(sys.argv[sys.argv.index("--rows-file") + 1])
        result = ([] if _only() == "model-free" else _distributed_rows()) + _model_free_distributed_rows()
        if int(os.environ.get("RANK", 0)) == 0:
            rows_file.write_text(json.dumps(result))
        from hasten.state import PartialState

        PartialState().destroy_process_group()
    else:
        print("\n" + format_table(main(_only())))
