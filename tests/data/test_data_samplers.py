"""BatchSamplerShard and SeedableRandomSampler in one process (processes simulated by index)."""
import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from hasten.data import BatchSamplerShard, SeedableRandomSampler, get_sampler
from hasten.data.index_order import has_known_batching


class WalkedBatchSampler(BatchSampler):
    """A torch BatchSampler the shard cannot see through: forces the walking path."""

    def __iter__(self):
        yield from super().__iter__()


class VariableBatches:
    """A custom batch sampler without batch_size: batches of varying sizes."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter([list(b) for b in self.batches])

    def __len__(self):
        return len(self.batches)


def shards(batch_sampler, num_processes, **kwargs):
    return [list(BatchSamplerShard(batch_sampler, num_processes, index, **kwargs)) for index in range(num_processes)]


# ------------------------------------------------------------------ the SPEC's examples
def test_spec_example_without_split():
    sampler = BatchSampler(range(8), batch_size=4, drop_last=False)
    assert shards(sampler, 2) == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]


def test_spec_example_with_split():
    sampler = BatchSampler(range(8), batch_size=4, drop_last=False)
    assert shards(sampler, 2, split_batches=True) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_even_batches_loops_back_to_the_start():
    # 10 samples, batches of 3, 2 processes: batches [0,1,2] [3,4,5] [6,7,8] [9]; the last is completed with 0, 1
    sampler = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)
    assert shards(sampler, 2) == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 0, 1]]]
    assert shards(sampler, 2, even_batches=False) == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9]]]


def test_tiny_dataset_is_repeated_until_every_process_has_a_full_batch():
    sampler = BatchSampler(SequentialSampler(range(1)), batch_size=2, drop_last=False)
    assert shards(sampler, 3) == [[[0, 0]], [[0, 0]], [[0, 0]]]
    assert shards(sampler, 3, even_batches=False) == [[[0]], [], []]


def test_drop_last_drops_incomplete_rounds():
    sampler = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=True)
    assert shards(sampler, 2) == [[[0, 1, 2]], [[3, 4, 5]]]


def test_every_sample_once_without_even_batches():
    for length, size, processes in itertools.product(range(0, 30, 7), (1, 3, 4), (1, 2, 3)):
        sampler = BatchSampler(SequentialSampler(range(length)), batch_size=size, drop_last=False)
        seen = [i for shard in shards(sampler, processes, even_batches=False) for batch in shard for i in batch]
        assert sorted(seen) == list(range(length))


def test_batch_sampler_without_batch_size_completes_with_whole_batches():
    sampler = VariableBatches([[0, 1, 2], [3], [4, 5]])
    assert shards(sampler, 2) == [[[0, 1, 2], [4, 5]], [[3], [0, 1, 2]]]
    assert shards(sampler, 2, even_batches=False) == [[[0, 1, 2], [4, 5]], [[3]]]
    for index in range(2):
        assert len(BatchSamplerShard(sampler, 2, index)) == 2


# ------------------------------------------------------------------ length agrees with iteration
@pytest.mark.parametrize("split", [False, True])
def test_len_agrees_with_iteration(split):
    for length, size, drop_last, processes, even in itertools.product(
            range(0, 14), (2, 4), (False, True), (1, 2), (False, True)):
        for index in range(processes):
            shard = BatchSamplerShard(BatchSampler(SequentialSampler(range(length)), size, drop_last), processes,
                                      index, split_batches=split, even_batches=even)
            assert len(shard) == len(list(shard)), (length, size, drop_last, processes, index, even)


# ------------------------------------------------------------------ fast path == walking path
@pytest.mark.parametrize("sampler_kind", ["sequential", "random", "seedable"])
def test_sliced_order_matches_walked_batches(sampler_kind):
    for length, size, drop_last, processes, split, even in itertools.product(
            (0, 1, 5, 12, 13), (1, 2, 4), (False, True), (1, 2, 4), (False, True), (False, True)):
        if split and size % processes:
            continue
        for index in range(processes):
            results = []
            for kind in (BatchSampler, WalkedBatchSampler):
                if sampler_kind == "sequential":
                    sampler = SequentialSampler(range(length))
                elif sampler_kind == "random":
                    sampler = RandomSampler(range(length), generator=torch.Generator().manual_seed(7)) if length else \
                        SequentialSampler(range(0))
                else:
                    sampler = SeedableRandomSampler(range(length), data_seed=7) if length else SequentialSampler([])
                batch_sampler = kind(sampler, size, drop_last)
                assert has_known_batching(batch_sampler) == (kind is BatchSampler)
                results.append(list(BatchSamplerShard(batch_sampler, processes, index, split, even)))
            assert results[0] == results[1], (length, size, drop_last, processes, index, split, even)


# ------------------------------------------------------------------ position
@pytest.mark.parametrize("kind", [BatchSampler, WalkedBatchSampler])
def test_start_at_skips_exactly_that_many_batches_once(kind):
    sampler = kind(SeedableRandomSampler(range(23), data_seed=3), 3, False)
    for processes, index, split in [(1, 0, False), (2, 1, False), (3, 2, True)]:
        full = list(BatchSamplerShard(kind(SeedableRandomSampler(range(23), data_seed=3), 3, False), processes, index,
                                      split_batches=split))
        shard = BatchSamplerShard(sampler, processes, index, split_batches=split)
        shard.sampler.set_epoch(0)
        shard.start_at(2)
        assert list(shard) == full[2:]
        shard.sampler.set_epoch(0)
        assert list(shard) == full  # the skip applied to one pass only


def test_state_dict_round_trip_resumes_mid_pass():
    def make():
        return BatchSamplerShard(BatchSampler(SeedableRandomSampler(range(50), data_seed=11), 4, False), 2, 1)

    reference = list(make())
    shard = make()
    iterator = iter(shard)
    taken = [next(iterator) for _ in range(3)]
    state = shard.state_dict()
    assert state == {"batches_yielded": 3, "sampler": {"epoch": 0, "seed": 11}}
    resumed = make()
    resumed.load_state_dict(state)
    assert taken + list(resumed) == reference


def test_start_at_rejects_negative_values():
    shard = BatchSamplerShard(BatchSampler(range(4), 2, False))
    with pytest.raises(ValueError, match="int >= 0"):
        shard.start_at(-1)


def test_skipping_does_not_walk_the_skipped_indices(monkeypatch):
    def no_walking(self):
        raise AssertionError("the sampler was walked")

    monkeypatch.setattr(SequentialSampler, "__iter__", no_walking)
    shard = BatchSamplerShard(BatchSampler(SequentialSampler(range(10**9)), 10, False), 2, 0)
    shard.start_at(40_000_000)
    assert next(iter(shard)) == list(range(800_000_000, 800_000_010))


# ------------------------------------------------------------------ errors
def test_split_batches_needs_a_divisible_batch_size():
    with pytest.raises(ValueError, match=r"batch size \(3\) must be a round multiple of the number of processes \(2\)"):
        BatchSamplerShard(BatchSampler(range(8), 3, False), 2, 0, split_batches=True)
    with pytest.raises(ValueError, match="batch_size=None"):
        BatchSamplerShard(VariableBatches([[0]]), 2, 0, split_batches=True)


@pytest.mark.parametrize("processes, index", [(0, 0), (2, 2), (2, -1), (1.5, 0)])
def test_bad_process_layout(processes, index):
    with pytest.raises(ValueError, match="num_processes|process_index"):
        BatchSamplerShard(BatchSampler(range(8), 2, False), processes, index)


# ------------------------------------------------------------------ SeedableRandomSampler
def test_seedable_sampler_depends_only_on_seed_and_epoch():
    first = SeedableRandomSampler(range(100), data_seed=5)
    torch.manual_seed(1234)  # the global generator plays no part
    second = SeedableRandomSampler(range(100), data_seed=5)
    assert list(first) == list(second)
    assert list(first) == list(second)  # epoch 1 on both
    assert first.epoch == 2


def test_seedable_sampler_order_is_a_permutation_that_changes_with_the_epoch():
    sampler = SeedableRandomSampler(range(64), data_seed=0)
    epoch0 = list(sampler)
    sampler.set_epoch(0)
    assert list(sampler) == epoch0
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert sorted(epoch0) == sorted(epoch1) == list(range(64))
    assert epoch0 != epoch1


def test_seedable_sampler_is_torch_randperm_of_seed_plus_epoch():
    sampler = SeedableRandomSampler(range(20), data_seed=40)
    sampler.set_epoch(2)
    expected = torch.randperm(20, generator=torch.Generator().manual_seed(42)).tolist()
    assert list(sampler) == expected


def test_seedable_sampler_defaults_to_torch_initial_seed():
    torch.manual_seed(77)
    assert SeedableRandomSampler(range(3)).initial_seed == 77


def test_seedable_sampler_epoch_indices_does_not_advance():
    sampler = SeedableRandomSampler(range(10), data_seed=1)
    assert sampler.epoch_indices() == sampler.epoch_indices() == list(sampler)
    assert sampler.epoch == 1


def test_seedable_sampler_matches_the_reference_bitwise():
    reference = pytest.importorskip("accelerate.data_loader")
    for seed, epoch, kwargs in [(0, 0, {}), (3, 2, {}), (9, 1, {"replacement": True, "num_samples": 40}),
                                (5, 0, {"num_samples": 25})]:
        mine = SeedableRandomSampler(range(17), data_seed=seed, **kwargs)
        theirs = reference.SeedableRandomSampler(range(17), data_seed=seed, **kwargs)
        mine.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(mine) == list(theirs)


def test_seedable_sampler_state_round_trip():
    sampler = SeedableRandomSampler(range(10), data_seed=8)
    sampler.set_epoch(4)
    other = SeedableRandomSampler(range(10), data_seed=1)
    other.load_state_dict(sampler.state_dict())
    assert list(other) == list(sampler)


def test_get_sampler_finds_the_index_sampler():
    from torch.utils.data import DataLoader

    loader = DataLoader(range(4), batch_size=2, shuffle=True)
    assert isinstance(get_sampler(loader), RandomSampler)
    as_sampler = DataLoader(range(4), sampler=BatchSampler(SequentialSampler(range(4)), 2, False), batch_size=None)
    assert isinstance(get_sampler(as_sampler), SequentialSampler)


@pytest.mark.parametrize("length, replacement, num_samples", [(1, False, None), (10, False, None), (10, False, 25),
                                                               (10, False, 3), (7, True, None), (7, True, 70)])
def test_random_sampler_order_is_what_iterating_it_gives(length, replacement, num_samples):
    from hasten.data.index_order import random_sampler_order

    made = [RandomSampler(range(length), replacement, num_samples, torch.Generator().manual_seed(4)) for _ in range(2)]
    for _ in range(2):  # the generators must also advance alike once the pass is complete
        order, when_complete = random_sampler_order(made[0])
        if when_complete is not None:
            when_complete()
        assert order.tolist() == list(made[1])
    torch.manual_seed(9)
    without_generator = random_sampler_order(RandomSampler(range(length), replacement, num_samples))[0].tolist()
    torch.manual_seed(9)
    assert without_generator == list(RandomSampler(range(length), replacement, num_samples))


def test_sliced_order_converted_in_small_chunks_gives_the_same_batches(monkeypatch):
    from hasten.data import batch_shard

    monkeypatch.setattr(batch_shard._Indices, "CHUNK", 5)  # batches straddle chunk boundaries
    for size, processes, split in [(3, 2, False), (4, 2, True), (7, 3, False)]:
        for index in range(processes):
            results = [list(BatchSamplerShard(kind(SeedableRandomSampler(range(53), data_seed=2), size, False),
                                              processes, index, split)) for kind in (BatchSampler, WalkedBatchSampler)]
            assert results[0] == results[1]
