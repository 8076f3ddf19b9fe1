"""IterableDatasetShard in one process (processes simulated by index)."""
import itertools

import pytest
import torch
from torch.utils.data import IterableDataset

from hasten.data import IterableDatasetShard
from hasten.data.iterable import StatefulIterableDatasetShard
from fixtures import ResumableStream


class Numbers(IterableDataset):
    def __init__(self, length, sized=True):
        self.length = length
        self.sized = sized

    def __iter__(self):
        return iter(range(self.length))

    def __len__(self):
        if not self.sized:
            raise TypeError("no length")
        return self.length


class ShuffledNumbers(IterableDataset):
    """Shuffles with its own generator (and has no set_epoch)."""

    def __init__(self, length, seed):
        self.length = length
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self):
        return iter(torch.randperm(self.length, generator=self.generator).tolist())


def shares(dataset_factory, processes, **kwargs):
    return [list(IterableDatasetShard(dataset_factory(), num_processes=processes, process_index=index, **kwargs))
            for index in range(processes)]


def test_spec_examples():
    assert shares(lambda: Numbers(8), 2, batch_size=4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert shares(lambda: Numbers(8), 2, batch_size=4, split_batches=True) == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_last_batch_is_completed_from_the_first_one_or_dropped():
    # 10 samples, 2 processes x 3: global batches [0..5] and [6..9] + [0, 1]
    assert shares(lambda: Numbers(10), 2, batch_size=3) == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 0, 1]]
    assert shares(lambda: Numbers(10), 2, batch_size=3, drop_last=True) == [[0, 1, 2], [3, 4, 5]]


def test_stream_shorter_than_one_global_batch_is_cycled():
    assert shares(lambda: Numbers(2), 2, batch_size=3) == [[0, 1, 0], [1, 0, 1]]
    assert shares(lambda: Numbers(0), 2, batch_size=3) == [[], []]


def test_len_agrees_with_iteration():
    for length, size, drop_last, processes, split in itertools.product(range(0, 15), (1, 2, 4), (False, True),
                                                                       (1, 2), (False, True)):
        if split and size % processes:
            continue
        for index in range(processes):
            shard = IterableDatasetShard(Numbers(length), size, drop_last, processes, index, split)
            assert len(shard) == len(list(shard)), (length, size, drop_last, processes, index, split)


def test_len_of_an_unsized_stream_is_a_type_error():
    with pytest.raises(TypeError):
        len(IterableDatasetShard(Numbers(3, sized=False)))


def test_split_batches_needs_a_divisible_batch_size():
    with pytest.raises(ValueError, match=r"batch size \(1\) must be a round multiple of the number of processes \(2\)"):
        IterableDatasetShard(Numbers(4), batch_size=1, num_processes=2, split_batches=True)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        IterableDatasetShard(Numbers(4), batch_size=0)


def test_dataset_generator_gives_the_same_stream_on_every_process_and_a_new_one_each_epoch():
    epochs = []
    for epoch in range(2):
        parts = []
        for index in range(2):
            shard = IterableDatasetShard(ShuffledNumbers(12, seed=4), batch_size=3, num_processes=2,
                                         process_index=index)
            shard.set_epoch(epoch)
            parts.append(list(shard))
        assert sorted(parts[0] + parts[1]) == list(range(12))  # no overlap: both read the same order
        epochs.append(parts)
    assert epochs[0] != epochs[1]


def test_set_epoch_is_forwarded():
    class WithEpoch(Numbers):
        epoch = None

        def set_epoch(self, epoch):
            self.epoch = epoch

    dataset = WithEpoch(3)
    IterableDatasetShard(dataset).set_epoch(5)
    assert dataset.epoch == 5


def test_dataset_with_its_own_state_gives_a_resumable_shard():
    assert type(IterableDatasetShard(Numbers(3))) is IterableDatasetShard
    assert isinstance(IterableDatasetShard(ResumableStream(3)), StatefulIterableDatasetShard)


@pytest.mark.parametrize("split, taken", [(False, 5), (True, 3), (False, 0), (False, 2), (True, 1)])
def test_stateful_shard_resumes_without_replaying(split, taken):
    def make(dataset):
        return IterableDatasetShard(dataset, batch_size=2, num_processes=2, process_index=1, split_batches=split)

    full = list(make(ResumableStream(11)))
    dataset = ResumableStream(11)
    shard = make(dataset)
    iterator = iter(shard)
    head = [next(iterator) for _ in range(min(taken, len(full)))]
    state = shard.state_dict()
    resumed_dataset = ResumableStream(11)
    resumed = make(resumed_dataset)
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    # only the rest of the stream was read (nothing when the saved pass had read it all)
    assert resumed_dataset.reads == (0 if state["ended"] else 11 - state["dataset"]["position"])
