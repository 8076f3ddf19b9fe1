"""prepare_data_loader's parameters, the loaders it builds, and its errors (one process)."""
import collections
import pickle

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler, TensorDataset

from hasten.data import (DataLoaderDispatcher, DataLoaderShard, IterableDatasetShard, SeedableRandomSampler,
                         prepare_data_loader)
from hasten.state import GradientState

Pair = collections.namedtuple("Pair", ["features", "label"])


class Records(Dataset):
    """Map-style samples with nested structure and a string field."""

    def __len__(self):
        return 10

    def __getitem__(self, index):
        return {"x": torch.full((2,), float(index)), "pair": (torch.tensor(index), [torch.tensor(-index)]),
                "name": f"r{index}"}


class Stream(IterableDataset):
    def __init__(self, length):
        self.length = length

    def __iter__(self):
        return iter(torch.arange(self.length).tolist())

    def __len__(self):
        return self.length


def values(loader):
    return [batch.tolist() for batch in loader]


# ------------------------------------------------------------------ what it builds
def test_map_style_loader_becomes_a_dataloader_shard():
    prepared = prepare_data_loader(DataLoader(range(10), batch_size=2), num_processes=2, process_index=1)
    assert isinstance(prepared, DataLoaderShard) and isinstance(prepared, DataLoader)
    assert values(prepared) == [[2, 3], [6, 7], [0, 1]]
    assert prepared.total_batch_size == 4
    assert prepared.total_dataset_length == 10


def test_iterable_dataset_is_sharded_when_not_dispatched():
    prepared = prepare_data_loader(DataLoader(Stream(8), batch_size=2), num_processes=2, process_index=1,
                                   dispatch_batches=False)
    assert isinstance(prepared.dataset, IterableDatasetShard)
    assert values(prepared) == [[2, 3], [6, 7]]


def test_iterable_dataset_is_dispatched_by_default_in_a_real_run():
    prepared = prepare_data_loader(DataLoader(Stream(5), batch_size=2))
    assert isinstance(prepared, DataLoaderDispatcher)
    assert values(prepared) == [[0, 1], [2, 3], [4]]
    assert len(prepared) == 3


def test_dispatch_cannot_be_simulated():
    loader = DataLoader(Stream(5), batch_size=2)
    with pytest.raises(ValueError, match="num_processes=2 does not divide the 1 running"):
        prepare_data_loader(loader, num_processes=2, process_index=0, dispatch_batches=True)
    # the default switches to sharding when processes are simulated
    assert isinstance(prepare_data_loader(loader, num_processes=2, process_index=0), DataLoaderShard)


def test_dispatcher_in_one_process_yields_nested_batches_with_strings():
    loader = DataLoader(Records(), batch_size=4)
    prepared = prepare_data_loader(loader, dispatch_batches=True)
    batches = list(prepared)
    assert [b["name"] for b in batches] == [[f"r{i}" for i in range(s, min(s + 4, 10))] for s in (0, 4, 8)]
    assert torch.equal(batches[2]["pair"][1][0], torch.tensor([-8, -9]))


def test_put_on_device_moves_nested_batches():
    loader = DataLoader(Records(), batch_size=5)
    moved = next(iter(prepare_data_loader(loader, device=torch.device("meta"), put_on_device=True)))
    assert moved["x"].device.type == "meta" and moved["pair"][1][0].device.type == "meta"
    assert moved["name"] == [f"r{i}" for i in range(5)]
    kept = next(iter(prepare_data_loader(loader, device=torch.device("meta"))))
    assert kept["x"].device.type == "cpu"


def test_namedtuple_batches_keep_their_type():
    dataset = [Pair(torch.tensor([float(i)]), i) for i in range(6)]
    loader = DataLoader(dataset, batch_size=3, collate_fn=lambda items: Pair(
        torch.stack([item.features for item in items]), torch.tensor([item.label for item in items])))
    for prepared in (prepare_data_loader(loader, num_processes=2, process_index=1),
                     prepare_data_loader(loader, dispatch_batches=True, put_on_device=True)):
        batch = next(iter(prepared))
        assert isinstance(batch, Pair)


def test_loader_settings_are_kept():
    def collate(items):
        return torch.tensor(items) * 10

    def init_worker(worker_id):
        return None

    generator = torch.Generator().manual_seed(1)
    loader = DataLoader(range(8), batch_size=2, collate_fn=collate, num_workers=1, pin_memory=False,
                        worker_init_fn=init_worker, persistent_workers=True, prefetch_factor=3, generator=generator,
                        timeout=7)
    prepared = prepare_data_loader(loader, num_processes=2, process_index=0)
    for name in ("collate_fn", "num_workers", "pin_memory", "worker_init_fn", "persistent_workers", "prefetch_factor",
                 "generator", "timeout"):
        assert getattr(prepared, name) == getattr(loader, name), name
    assert values(prepared) == [[0, 10], [40, 50]]


def test_user_objects_are_not_changed():
    loader = DataLoader(range(10), batch_size=2, shuffle=True)
    batch_sampler, sampler = loader.batch_sampler, loader.sampler
    prepare_data_loader(loader, num_processes=2, process_index=0, use_seedable_sampler=True)
    prepare_data_loader(loader, num_processes=2, process_index=0)
    assert loader.batch_sampler is batch_sampler and batch_sampler.sampler is sampler and sampler.generator is None


def test_sampler_given_as_a_batch_sampler():
    dataset = TensorDataset(torch.arange(10))

    class Batched(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, indices):
            return torch.tensor(indices)

    loader = DataLoader(Batched(), sampler=BatchSampler(SequentialSampler(dataset), 3, False), batch_size=None)
    prepared = prepare_data_loader(loader, num_processes=2, process_index=1)
    assert values(prepared) == [[3, 4, 5], [9, 0, 1]]
    assert len(prepared) == 2


# ------------------------------------------------------------------ randomness
def test_seedable_sampler_is_reproducible_and_follows_set_epoch():
    def run(epoch):
        prepared = prepare_data_loader(DataLoader(range(20), batch_size=4, shuffle=True), num_processes=2,
                                       process_index=0, use_seedable_sampler=True, data_seed=13)
        assert isinstance(prepared.get_sampler(), SeedableRandomSampler)
        prepared.set_epoch(epoch)
        return values(prepared)

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_shuffle_differs_between_epochs_and_covers_every_sample():
    prepared = prepare_data_loader(DataLoader(range(12), batch_size=3, shuffle=True))
    first, second = values(prepared), values(prepared)
    assert first != second
    assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(12))


@pytest.mark.parametrize("case", ["shuffle", "seedable", "workers", "iterable", "dispatch", "direct-shuffle"])
def test_creating_an_iterator_does_not_change_later_random_numbers(case):
    def make():
        if case == "direct-shuffle":
            return DataLoaderShard(range(16), batch_size=4, shuffle=True)
        if case == "iterable":
            return prepare_data_loader(DataLoader(Stream(9), batch_size=2), num_processes=2, process_index=1,
                                       dispatch_batches=False)
        if case == "dispatch":
            return prepare_data_loader(DataLoader(Stream(9), batch_size=2), dispatch_batches=True)
        loader = DataLoader(range(16), batch_size=4, shuffle=True, num_workers=2 if case == "workers" else 0)
        return prepare_data_loader(loader, num_processes=2, process_index=0, use_seedable_sampler=case == "seedable")

    prepared = make()
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    iterator = iter(prepared)
    next(iterator)
    assert torch.equal(torch.rand(3), expected)
    del iterator


def test_rng_types_are_checked_at_prepare_time():
    loader = DataLoader(range(4), batch_size=2, shuffle=True)
    with pytest.raises(ValueError, match="Unknown rng type in rng_types 'dice'"):
        prepare_data_loader(loader, rng_types=["torch", "dice"])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="rng_types contains 'cuda', but no CUDA device"):
            prepare_data_loader(loader, rng_types=["cuda"])


def test_generator_rng_type_is_dropped_without_a_generator_and_the_list_is_not_changed():
    rng_types = ["torch", "generator"]
    prepared = prepare_data_loader(DataLoader(range(4), batch_size=2), num_processes=2, process_index=0,
                                   rng_types=rng_types)
    assert rng_types == ["torch", "generator"]
    assert prepared.rng_types == ["torch"]
    shuffled = prepare_data_loader(DataLoader(range(4), batch_size=2, shuffle=True), rng_types=rng_types)
    assert shuffled.rng_types == ["torch", "generator"]
    assert shuffled.synchronized_generator is shuffled.get_sampler().generator
    assert values(shuffled)  # synchronising in one process is a no-op that must not fail


# ------------------------------------------------------------------ bad input
def test_split_batches_with_an_indivisible_batch_size():
    for dataset in (range(12), Stream(12)):
        with pytest.raises(ValueError, match=r"batch size \(3\) must be a round multiple of the number of processes \(2\)"):
            prepare_data_loader(DataLoader(dataset, batch_size=3), num_processes=2, process_index=0,
                                split_batches=True, dispatch_batches=False)


def test_split_batches_needs_a_known_batch_size():
    class Batches:
        def __iter__(self):
            return iter([[0, 1]])

        def __len__(self):
            return 1

    with pytest.raises(ValueError, match="batch_size=None"):
        prepare_data_loader(DataLoader(range(2), batch_sampler=Batches()), num_processes=2, process_index=0,
                            split_batches=True)


def test_batch_sampler_as_sampler_with_a_batch_size():
    loader = DataLoader(range(8), sampler=BatchSampler(SequentialSampler(range(8)), 4, False), batch_size=2)
    with pytest.raises(ValueError, match="sampler is a batch sampler .* batch_size=2"):
        prepare_data_loader(loader)


def test_batch_sampler_with_batch_size_in_a_loader_class():
    with pytest.raises(ValueError, match="batch_sampler=BatchSampler together with batch_size=4"):
        DataLoaderShard(range(8), batch_sampler=BatchSampler(range(8), 2, False), batch_size=4)


def test_slice_fn_must_be_callable():
    with pytest.raises(TypeError, match="slice_fn_for_dispatch must be a callable"):
        prepare_data_loader(DataLoader(Stream(4), batch_size=2), slice_fn_for_dispatch="rows")


def test_stateful_loader_without_torchdata(monkeypatch):
    import hasten.core.imports as imports

    found = imports._found
    monkeypatch.setattr(imports, "_found", lambda module: False if module.startswith("torchdata") else found(module))
    with pytest.raises(ImportError, match=r"pip install 'hasten\[stateful\]'"):
        prepare_data_loader(DataLoader(range(4), batch_size=2), use_stateful_dataloader=True)


def test_bad_process_layout():
    with pytest.raises(ValueError, match="process_index must be an int in \\[0, 1\\]"):
        prepare_data_loader(DataLoader(range(4)), num_processes=2, process_index=2)


def test_data_seed_without_seedable_sampler_warns():
    with pytest.warns(UserWarning, match="data_seed has no effect"):
        prepare_data_loader(DataLoader(range(4)), data_seed=3)


# ------------------------------------------------------------------ end of loader, remainder
@pytest.mark.parametrize("dispatch", [False, True])
def test_gradient_state_learns_the_end_and_the_remainder(dispatch):
    # 10 samples, 2 processes x 4: the last global batch has 2 real samples
    if dispatch:
        prepared = prepare_data_loader(DataLoader(Stream(10), batch_size=8), dispatch_batches=True)
        expected_remainder = 2
    else:
        prepared = prepare_data_loader(DataLoader(range(10), batch_size=4), num_processes=2, process_index=1)
        expected_remainder = 2
    state = GradientState()
    seen = []
    for _ in prepared:
        seen.append((state.active_dataloader is prepared, state.end_of_dataloader))
    assert seen == [(True, False), (True, True)]
    assert state.remainder == -1 and state.active_dataloader is None
    assert prepared.remainder == expected_remainder


def test_remainder_counts_the_samples_the_sampler_really_yields():
    from torch.utils.data import RandomSampler

    loader = DataLoader(range(100), batch_size=4, sampler=RandomSampler(range(100), num_samples=10,
                                                                         generator=torch.Generator()))
    prepared = prepare_data_loader(loader, num_processes=2, process_index=0)
    for _ in prepared:
        remainder = GradientState().remainder
    assert remainder == 2  # 10 samples, global batches of 8


def test_abandoned_pass_unregisters_the_loader():
    prepared = prepare_data_loader(DataLoader(range(10), batch_size=2))
    state = GradientState()
    for _ in prepared:
        assert state.active_dataloader is prepared
        break
    assert state.active_dataloader is None


# ------------------------------------------------------------------ device mesh
class FakeMesh:
    """What prepare_data_loader reads from a DeviceMesh (the real one is used in tests/distributed)."""

    def __init__(self, names, shape, coordinate):
        self.mesh_dim_names, self._shape, self._coordinate = names, shape, coordinate

    def get_coordinate(self):
        return self._coordinate

    def size(self, dim):
        return self._shape[dim]


def test_device_mesh_shares_data_over_data_parallel_dimensions_only():
    def batches(coordinate):
        mesh = FakeMesh(("dp", "tp"), (2, 2), coordinate)
        return values(prepare_data_loader(DataLoader(range(8), batch_size=2), torch_device_mesh=mesh,
                                          dispatch_batches=False))

    assert batches([0, 0]) == batches([0, 1]) == [[0, 1], [4, 5]]
    assert batches([1, 0]) == batches([1, 1]) == [[2, 3], [6, 7]]


def test_device_mesh_with_unknown_dimension_names():
    with pytest.raises(ValueError, match=r"dimension\(s\) \['rows'\] whose role is unknown"):
        prepare_data_loader(DataLoader(range(8)), torch_device_mesh=FakeMesh(("rows",), (2,), [0]))
    with pytest.raises(ValueError, match="named dimensions"):
        prepare_data_loader(DataLoader(range(8)), torch_device_mesh=FakeMesh(None, (2,), [0]))


# ------------------------------------------------------------------ pickling
def test_prepared_loaders_can_be_pickled():
    prepared = prepare_data_loader(DataLoader(range(10), batch_size=2, shuffle=True), num_processes=2,
                                   process_index=1, use_seedable_sampler=True)
    clone = pickle.loads(pickle.dumps(prepared))
    assert type(clone) is DataLoaderShard
    assert values(clone) == values(prepared)


def test_loader_without_automatic_batching_is_shared_sample_by_sample():
    loader = DataLoader(list(range(5)), batch_size=None, shuffle=False)
    shares = [list(prepare_data_loader(loader, num_processes=2, process_index=i)) for i in range(2)]
    assert shares == [[0, 2, 4], [1, 3, 0]]
    assert list(prepare_data_loader(loader)) == [0, 1, 2, 3, 4]
    stream = [list(prepare_data_loader(DataLoader(Stream(5), batch_size=None), num_processes=2, process_index=i))
              for i in range(2)]
    assert stream == [[0, 2, 4], [1, 3, 0]]
    with pytest.raises(ValueError, match="batch_size=None"):
        prepare_data_loader(DataLoader(Stream(5), batch_size=None), dispatch_batches=True)


def test_hugging_face_iterable_dataset_is_split_by_shards(monkeypatch):
    import sys
    import types

    class FakeHubIterable(IterableDataset):
        """Stands in for datasets.IterableDataset: n_shards and shard(num_shards, index)."""

        def __init__(self, items, n_shards):
            self.items, self.n_shards = items, n_shards

        def shard(self, num_shards, index):
            return FakeHubIterable(self.items[index::num_shards], 1)

        def __iter__(self):
            return iter(self.items)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(IterableDataset=FakeHubIterable))
    loader = DataLoader(FakeHubIterable(list(range(8)), n_shards=4), batch_size=2)
    shares = [values(prepare_data_loader(loader, num_processes=2, process_index=i, dispatch_batches=False))
              for i in range(2)]
    assert shares == [[[0, 2], [4, 6]], [[1, 3], [5, 7]]]
    few_shards = DataLoader(FakeHubIterable(list(range(8)), n_shards=1), batch_size=2)
    assert isinstance(prepare_data_loader(few_shards, num_processes=2, process_index=0,
                                          dispatch_batches=False).dataset, IterableDatasetShard)


def test_non_blocking_reaches_the_device_copies(monkeypatch):
    import hasten.data.shard_loader as shard_loader

    calls = []
    real = shard_loader.send_to_device

    def recording(batch, device, non_blocking=False):
        calls.append(non_blocking)
        return real(batch, device, non_blocking=non_blocking)

    monkeypatch.setattr(shard_loader, "send_to_device", recording)
    # a real move (batches already on the device are not handed to send_to_device at all)
    list(prepare_data_loader(DataLoader(range(4), batch_size=2), device="meta", put_on_device=True, non_blocking=True))
    assert calls == [True, True]


def test_epochs_reach_samplers_and_datasets_that_take_them():
    class Tracking(SequentialSampler):
        def __init__(self, source):
            super().__init__(source)
            self.epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    class EpochDataset(Dataset):
        def __init__(self):
            self.epochs = []

        def __len__(self):
            return 4

        def __getitem__(self, index):
            return index

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    dataset = EpochDataset()
    sampler = Tracking(range(4))
    prepared = prepare_data_loader(DataLoader(dataset, batch_size=2, sampler=sampler), num_processes=2,
                                   process_index=0)
    list(prepared)
    list(prepared)
    prepared.set_epoch(7)
    assert sampler.epochs == [0, 1, 7] and dataset.epochs == [0, 1, 7]
    assert prepared.iteration == 7


def test_generator_of_a_batch_sampler_without_sampler_is_synchronised():
    class ShuffledBatches:
        """A batch sampler with its own generator and no index sampler."""

        batch_size, drop_last = 2, False

        def __init__(self):
            self.generator = torch.Generator().manual_seed(3)

        def __iter__(self):
            order = torch.randperm(6, generator=self.generator).tolist()
            return iter([order[i:i + 2] for i in range(0, 6, 2)])

        def __len__(self):
            return 3

    batch_sampler = ShuffledBatches()
    prepared = prepare_data_loader(DataLoader(range(6), batch_sampler=batch_sampler), rng_types=["generator"])
    assert prepared.synchronized_generator is batch_sampler.generator
    assert sorted(sum(values(prepared), [])) == list(range(6))
