"""Multi-process checks of hasten.data (run with 2 processes by tests/data/test_data_distributed.py).

Every check runs on every process; results are compared with all_gather_object so that a wrong share on
any process fails the run. Prints ALL DATA CHECKS PASSED on process 0 at the end.
"""
import collections
import pickle
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset

from hasten.data import prepare_data_loader, skip_first_batches
from hasten.data.dispatcher import DispatchError
from hasten.state import GradientState, PartialState

Pair = collections.namedtuple("Pair", ["features", "label"])


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {dist.get_rank()}] {what}")


def everyone(value) -> list:
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def flat(batches) -> list:
    return [int(i) for batch in batches for i in (batch.tolist() if isinstance(batch, torch.Tensor) else batch)]


class Stream(IterableDataset):
    def __init__(self, length, fail_at=None):
        self.length, self.fail_at = length, fail_at

    def __iter__(self):
        for i in range(self.length):
            if i == self.fail_at:
                raise KeyError(f"sample {i} is corrupt")
            yield i

    def __len__(self):
        return self.length


class Records(Dataset):
    """Dict samples with a tensor, a nested tuple, a namedtuple and a string."""

    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "nested": (torch.tensor(i), Pair(torch.tensor([i, i]), i)),
                "text": f"sample-{i}"}


class VaryingBatches:
    """A batch sampler with batch sizes that vary (no batch_size attribute)."""

    def __init__(self, sizes):
        self.sizes = sizes

    def __iter__(self):
        start = 0
        for size in self.sizes:
            yield list(range(start, start + size))
            start += size

    def __len__(self):
        return len(self.sizes)


def check_sharding(rank, world):
    for length in (0, 1, 7, 16, 21):
        for size in (1, 3, 4):
            for split in (False, True):
                if split and size % world:
                    continue
                loader = DataLoader(range(length), batch_size=size)
                uneven = prepare_data_loader(loader, split_batches=split, even_batches=False)
                mine = [b.tolist() for b in uneven]
                check(len(mine) == len(uneven), f"len {len(uneven)} != {len(mine)} batches")
                samples = sum(everyone(flat(mine)), [])
                check(sorted(samples) == list(range(length)),
                      f"even_batches=False must give every sample once: {length=} {size=} {split=}: {samples}")
                even = [b.tolist() for b in prepare_data_loader(loader, split_batches=split)]
                counts = everyone([len(b) for b in even])
                check(all(c == counts[0] for c in counts), f"even_batches: unequal batches {counts}")
                check(set(sum(everyone(flat(even)), [])) == set(range(length)), "even_batches lost samples")
    for length in (0, 1, 9, 16):
        loader = DataLoader(Stream(length), batch_size=2)
        mine = flat(prepare_data_loader(loader, dispatch_batches=False))
        check(set(sum(everyone(mine), [])) == set(range(length)), f"iterable shards miss samples ({length})")
        check(len(set(map(len, everyone(mine)))) == 1, "iterable shards of unequal sizes")


def check_dispatcher(rank, world):
    # map-style and iterable data, uneven ends, every sample reaches some process, shares match the plan
    for length in (0, 1, 5, 8, 9):
        prepared = prepare_data_loader(DataLoader(Stream(length), batch_size=2), put_on_device=True)
        mine = [b.tolist() for b in prepared]
        check(len(mine) == len(prepared), "dispatcher len")
        shares = everyone(mine)
        check(set(sum((flat(s) for s in shares), [])) == set(range(length)), f"dispatch lost samples {shares}")
        check(len(set(map(len, shares))) == 1, f"dispatch gave unequal numbers of batches: {shares}")
    # the reference's batches: 9 samples, batch 2, 2 processes -> steps [0..3], [4..7], [8 + first sample 0]
    expected = {0: [[0, 1], [4, 5], [8]], 1: [[2, 3], [6, 7], [0]]}
    got = [b.tolist() for b in prepare_data_loader(DataLoader(Stream(9), batch_size=2), put_on_device=True)]
    check(got == expected[rank], f"dispatched batches {got} != {expected[rank]}")

    # nested dict / tuple / namedtuple batches with strings
    prepared = prepare_data_loader(DataLoader(Records(7), batch_size=3), dispatch_batches=True)
    texts, rows = [], []
    for batch in prepared:
        check(isinstance(batch["nested"][1], Pair), "namedtuple lost its type")
        check(len(batch["text"]) == batch["x"].shape[0], "strings not sliced with their rows")
        check(all(t == f"sample-{int(v)}" for t, v in zip(batch["text"], batch["x"][:, 0])), "strings misaligned")
        texts += batch["text"]
        rows += batch["nested"][0].tolist()
    check(set(sum(everyone(rows), [])) == set(range(7)), "nested dispatch lost rows")

    # batches of varying sizes (each step's sizes do not add up to a multiple of 2): nothing dropped; the
    # last step (3 samples) is completed with the first sample
    loader = DataLoader(range(30), batch_sampler=VaryingBatches([4, 3, 5, 2, 1, 6, 3]))
    mine = flat(prepare_data_loader(loader, dispatch_batches=True))
    check(sorted(sum(everyone(mine), [])) == [0] + list(range(24)), f"varying batch sizes: {everyone(mine)}")

    # shapes that cannot be joined (padded to each batch's longest sequence): whole batches per process
    class Padded(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return i

    def pad(items):
        return {"ids": torch.zeros(len(items), 2 + items[0]), "index": torch.tensor(items)}

    mine = [b["index"].tolist() for b in prepare_data_loader(DataLoader(Padded(), batch_size=2, collate_fn=pad),
                                                             dispatch_batches=True)]
    check(sorted(sum((flat(m) for m in everyone(mine)), [])) == list(range(6)), "unjoinable shapes lost samples")

    # split batches
    got = [b.tolist() for b in prepare_data_loader(DataLoader(Stream(7), batch_size=4), split_batches=True)]
    expected = {0: [[0, 1], [4, 5]], 1: [[2, 3], [6, 0]]}
    check(got == expected[rank], f"split dispatch {got}")

    # a failure while reading on process 0 reaches every process: no hang
    started = time.monotonic()
    prepared = prepare_data_loader(DataLoader(Stream(20, fail_at=9), batch_size=2), dispatch_batches=True)
    try:
        list(prepared)
        check(False, "the reading error was swallowed")
    except (KeyError, DispatchError) as error:
        check("corrupt" in str(error), f"unexpected error {error!r}")
    check(time.monotonic() - started < 30, "error propagation took too long")

    # a batch that cannot be sent (an unpicklable field) is an error everywhere, not a hang
    def with_callback(items):
        return {"x": torch.tensor(items), "callback": lambda: None}

    try:
        list(prepare_data_loader(DataLoader(range(6), batch_size=2, collate_fn=with_callback), dispatch_batches=True))
        check(False, "an unpicklable field was sent")
    except (AttributeError, TypeError, pickle.PicklingError, DispatchError) as error:
        check("pickle" in str(error) or "Can't" in str(error), f"unexpected error {error!r}")

    # resuming a dispatched loader
    full = [b.tolist() for b in prepare_data_loader(DataLoader(Stream(13), batch_size=2), dispatch_batches=True)]
    skipped = skip_first_batches(prepare_data_loader(DataLoader(Stream(13), batch_size=2), dispatch_batches=True), 2)
    check([b.tolist() for b in skipped] == full[2:], "skip_first_batches on a dispatcher")


def check_rng_synchronisation(rank, world):
    # processes seeded differently: the shuffle generator is synchronised from process 0 each epoch
    for epoch in range(2):
        torch.manual_seed(100 + rank)
        prepared = prepare_data_loader(DataLoader(range(20), batch_size=2, shuffle=True), rng_types=["generator"])
        samples = sum(everyone(flat(prepared)), [])
        check(sorted(samples) == list(range(20)), f"unsynchronised shuffles overlap: {samples}")
    torch.manual_seed(100 + rank)
    prepared = prepare_data_loader(DataLoader(range(20), batch_size=2, shuffle=True), use_seedable_sampler=True,
                                   data_seed=7)
    check(sorted(sum(everyone(flat(prepared)), [])) == list(range(20)), "seedable sampler differs across processes")


def check_resume(rank, world):
    def make(stateful):
        torch.manual_seed(1)
        loader = DataLoader(range(40), batch_size=3, shuffle=True, num_workers=1 if stateful else 0)
        return prepare_data_loader(loader, use_stateful_dataloader=stateful)

    for stateful in (False, True):
        full = [b.tolist() for b in make(stateful)]
        loader = make(stateful)
        iterator = iter(loader)
        head = [next(iterator).tolist() for _ in range(3)]
        state = loader.state_dict()
        del iterator
        resumed = make(stateful)
        resumed.load_state_dict(state)
        check(head + [b.tolist() for b in resumed] == full, f"resume (stateful={stateful}) did not continue")


def check_remainder(rank, world):
    # 10 samples, 2 processes x 4 (8 per step): last global batch holds 2 real samples
    for prepared in (prepare_data_loader(DataLoader(range(10), batch_size=4)),
                     prepare_data_loader(DataLoader(Stream(10), batch_size=4), dispatch_batches=True)):
        ends = []
        for _ in prepared:
            ends.append((GradientState().end_of_dataloader, GradientState().remainder))
        check(ends[-1] == (True, 2) and not any(end for end, _ in ends[:-1]), f"end/remainder {ends}")


def check_device_mesh(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    same = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
    batches = everyone([b.tolist() for b in prepare_data_loader(DataLoader(range(8), batch_size=2),
                                                                torch_device_mesh=same, dispatch_batches=False)])
    check(all(b == batches[0] for b in batches), f"tensor-parallel ranks got different data: {batches}")
    split = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))
    batches = everyone(flat(prepare_data_loader(DataLoader(range(8), batch_size=2), torch_device_mesh=split)))
    check(sorted(sum(batches, [])) == list(range(8)), f"data-parallel ranks overlap: {batches}")
    dispatched = everyone([b.tolist() for b in prepare_data_loader(DataLoader(Stream(8), batch_size=2),
                                                                   torch_device_mesh=same, dispatch_batches=True)])
    check(all(b == dispatched[0] for b in dispatched), f"dispatch to tensor-parallel ranks differs: {dispatched}")


def main():
    state = PartialState()
    rank, world = state.process_index, state.num_processes
    check(world == 2 and dist.is_initialized(), "needs a process group of 2 processes")
    for name, checker in [("sharding", check_sharding), ("dispatcher", check_dispatcher),
                          ("rng synchronisation", check_rng_synchronisation), ("resume", check_resume),
                          ("remainder", check_remainder), ("device mesh", check_device_mesh)]:
        checker(rank, world)
        if rank == 0:
            print(f"ok: {name}", flush=True)
    state.wait_for_everyone()
    if rank == 0:
        print("ALL DATA CHECKS PASSED", flush=True)
    state.destroy_process_group()  # leaving it to interpreter exit can abort the process (gloo, torch 2.13)


if __name__ == "__main__":
    main()
