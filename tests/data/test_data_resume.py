"""Resuming mid-epoch: skip_first_batches, loader state_dict / load_state_dict, torchdata's StatefulDataLoader."""
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from hasten.data import DataLoaderShard, SkipBatchSampler, SkipDataLoader, prepare_data_loader, skip_first_batches
from hasten.state import GradientState
from fixtures import Numbers, ResumableStream


class Counted(Dataset):
    """A map-style dataset that counts the samples it loads."""

    def __init__(self, length):
        self.length = length
        self.loaded = 0

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        self.loaded += 1
        return index


def values(loader):
    return [batch.tolist() for batch in loader]


# ------------------------------------------------------------------ skip_first_batches
def test_skip_first_batches_on_a_plain_loader_skips_once():
    loader = DataLoader(range(10), batch_size=3)
    skipped = skip_first_batches(loader, 2)
    assert isinstance(skipped, SkipDataLoader) and isinstance(skipped, DataLoader)
    assert len(skipped) == 2
    assert values(skipped) == [[6, 7, 8], [9]]
    assert len(skipped) == 4
    assert values(skipped) == values(loader)  # the next epoch is complete


def test_skip_first_batches_does_not_load_the_skipped_samples():
    dataset = Counted(10**6)
    skipped = skip_first_batches(prepare_data_loader(DataLoader(dataset, batch_size=4, shuffle=True),
                                                     num_processes=2, process_index=1), 100_000)
    batch = next(iter(skipped))
    assert dataset.loaded == 2 * 4  # the batch yielded and the one read ahead
    assert batch.shape == (4,)


@pytest.mark.parametrize("shuffle", [False, True])
def test_skip_first_batches_continues_the_epoch_of_a_prepared_loader(shuffle):
    def make():
        loader = DataLoader(range(30), batch_size=4, shuffle=shuffle, generator=torch.Generator().manual_seed(2))
        return prepare_data_loader(loader, num_processes=2, process_index=1)

    prepared = make()
    full = [values(prepared) for _ in range(2)]
    restarted = make()
    skipped = skip_first_batches(restarted, 2)
    assert values(skipped) == full[0][2:]
    assert values(skipped) == full[1]


def test_skip_first_batches_on_an_iterable_reads_and_drops():
    prepared = prepare_data_loader(DataLoader(Numbers(10), batch_size=2), num_processes=2, process_index=0,
                                   dispatch_batches=False)
    full = values(prepared)
    assert values(skip_first_batches(prepared, 1)) == full[1:]
    assert values(skip_first_batches(DataLoader(Numbers(10), batch_size=3), 2)) == [[6, 7, 8], [9]]


def test_skip_first_batches_on_a_dispatcher():
    prepared = prepare_data_loader(DataLoader(Numbers(9), batch_size=2), dispatch_batches=True)
    assert values(skip_first_batches(prepared, 3)) == [[6, 7], [8]]
    mapped = prepare_data_loader(DataLoader(Counted(9), batch_size=2), dispatch_batches=True)
    assert values(skip_first_batches(mapped, 3)) == [[6, 7], [8]]


def test_skip_first_batches_reports_the_end_of_the_loader():
    skipped = skip_first_batches(prepare_data_loader(DataLoader(range(8), batch_size=2)), 3)
    ends = [GradientState().end_of_dataloader for _ in skipped]
    assert ends == [True]


def test_skip_first_batches_rejects_bad_counts():
    with pytest.raises(ValueError, match="num_batches must be an int >= 0"):
        skip_first_batches(DataLoader(range(4)), -1)


def test_skip_batch_sampler_skips_its_first_pass_only():
    from torch.utils.data import BatchSampler, SequentialSampler

    sampler = SkipBatchSampler(BatchSampler(SequentialSampler(range(7)), 2, False), skip_batches=2)
    assert len(sampler) == 2
    assert list(sampler) == [[4, 5], [6]]
    assert list(sampler) == [[0, 1], [2, 3], [4, 5], [6]]


# ------------------------------------------------------------------ state_dict / load_state_dict
def run_and_interrupt(make, epochs_before: int, batches_before: int):
    """Iterate ``epochs_before`` full epochs and ``batches_before`` batches; return (seen, state)."""
    loader = make()
    seen = [values(loader) for _ in range(epochs_before)]
    iterator = iter(loader)
    seen.append([next(iterator).tolist() for _ in range(batches_before)])
    return seen, loader.state_dict()


@pytest.mark.parametrize("kind", ["shuffle", "seedable", "workers", "split", "sampler-generator"])
def test_load_state_dict_continues_exactly(kind):
    def make():
        loader = DataLoader(range(25), batch_size=3, shuffle=True, num_workers=2 if kind == "workers" else 0,
                            generator=torch.Generator().manual_seed(5) if kind == "sampler-generator" else None)
        torch.manual_seed(3)  # prepare draws the shuffle seed once; every run prepares alike
        return prepare_data_loader(loader, num_processes=3 if kind != "split" else 1, process_index=1 if kind !=
                                   "split" else 0, use_seedable_sampler=kind == "seedable",
                                   split_batches=kind == "split")

    uninterrupted = make()
    epochs = [values(uninterrupted) for _ in range(3)]
    head, state = run_and_interrupt(make, epochs_before=1, batches_before=2)
    assert head[0] == epochs[0] and head[1] == epochs[1][:2]
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.state_dict()["batches_yielded"] == 2
    assert values(resumed) == epochs[1][2:]
    assert values(resumed) == epochs[2]


def test_state_after_the_last_batch_points_at_the_next_epoch():
    def make():
        torch.manual_seed(0)
        return prepare_data_loader(DataLoader(range(9), batch_size=2, shuffle=True))

    loader = make()
    epochs = [values(loader) for _ in range(2)]
    again = make()
    for _ in again:
        state = again.state_dict()
    assert state["epoch"] == 1 and state["batches_yielded"] == 0
    resumed = make()
    resumed.load_state_dict(state)
    assert values(resumed) == epochs[1]


def test_resumed_run_draws_the_same_random_numbers():
    """A training loop that draws random numbers per batch gives the same numbers resumed or not."""
    def make():
        torch.manual_seed(10)
        return prepare_data_loader(DataLoader(range(20), batch_size=2, shuffle=True, num_workers=0))

    def train(loader, draws, stop=None):
        for index, batch in enumerate(loader):
            draws.append((batch.tolist(), torch.rand(1).item()))
            if stop is not None and index + 1 == stop:
                return loader.state_dict(), torch.get_rng_state()

    uninterrupted = []
    train(make(), uninterrupted)
    interrupted = []
    state, rng_state = train(make(), interrupted, stop=4)
    resumed = make()
    resumed.load_state_dict(state)
    torch.set_rng_state(rng_state)  # what a checkpoint restores
    train(resumed, interrupted)
    assert interrupted == uninterrupted


def test_iterable_dataset_with_its_own_state_is_not_replayed():
    def make(dataset):
        return prepare_data_loader(DataLoader(dataset, batch_size=2), num_processes=2, process_index=1,
                                   dispatch_batches=False)

    full = values(make(ResumableStream(21)))
    loader = make(ResumableStream(21))
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(3)]
    state = loader.state_dict()
    dataset = ResumableStream(21)
    resumed = make(dataset)
    resumed.load_state_dict(state)
    assert head + values(resumed) == full
    assert dataset.reads == 21 - 3 * 4  # 3 global batches of 4 were behind us: they are not read again


def test_load_state_dict_rejects_foreign_states():
    loader = prepare_data_loader(DataLoader(range(8), batch_size=2))
    with pytest.raises(ValueError, match="needs a dict from state_dict"):
        loader.load_state_dict({"position": 3})
    with pytest.raises(ValueError, match="use_stateful_dataloader=True"):
        loader.load_state_dict({"epoch": 0, "batches_yielded": 1, "base": {}})
    shuffled = prepare_data_loader(DataLoader(range(8), batch_size=2, shuffle=True))
    with pytest.raises(ValueError, match="restores a 'sampler' random generator but this loader has none"):
        loader.load_state_dict(shuffled.state_dict())


def test_len_stays_the_epoch_length_during_a_resumed_pass():
    # Accelerate's resume loop computes divmod(completed_steps, len(loader)) after load_state
    loader = prepare_data_loader(DataLoader(range(10), batch_size=2))
    loader.load_state_dict({"epoch": 0, "batches_yielded": 3})
    assert len(loader) == 5
    assert [len(loader) for _ in loader] == [5, 5]
    assert len(loader) == 5


# ------------------------------------------------------------------ torchdata's StatefulDataLoader
stateful = pytest.importorskip("torchdata.stateful_dataloader")


def test_stateful_loader_is_both_classes():
    loader = prepare_data_loader(DataLoader(range(8), batch_size=2), use_stateful_dataloader=True)
    assert isinstance(loader, DataLoaderShard) and isinstance(loader, stateful.StatefulDataLoader)
    assert type(loader).__name__ == "StatefulDataLoaderShard"
    import pickle

    assert values(pickle.loads(pickle.dumps(loader))) == values(loader)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("dataset_kind", ["map", "iterable-with-state"])
def test_stateful_loader_restores_mid_epoch(workers, dataset_kind):
    def make():
        dataset = Counted(26) if dataset_kind == "map" else ResumableStream(26)
        torch.manual_seed(4)
        loader = DataLoader(dataset, batch_size=3, shuffle=dataset_kind == "map", num_workers=workers)
        return prepare_data_loader(loader, num_processes=2, process_index=0, use_stateful_dataloader=True,
                                   dispatch_batches=False), dataset

    full_loader, _ = make()
    full = [values(full_loader) for _ in range(2)]
    loader, _ = make()
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(2)]
    state = loader.state_dict()
    del iterator
    resumed, dataset = make()
    resumed.load_state_dict(state)
    assert head + values(resumed) == full[0]
    assert values(resumed) == full[1]


@pytest.mark.parametrize("dataset_kind", ["map", "iterable-with-state"])
def test_stateful_loader_does_not_reread_what_was_consumed(dataset_kind):
    def make():
        dataset = Counted(60) if dataset_kind == "map" else ResumableStream(60)
        loader = DataLoader(dataset, batch_size=3)
        return prepare_data_loader(loader, num_processes=2, process_index=0, use_stateful_dataloader=True,
                                   dispatch_batches=False), dataset

    loader, _ = make()
    iterator = iter(loader)
    for _ in range(4):
        next(iterator)
    resumed, dataset = make()
    resumed.load_state_dict(loader.state_dict())
    assert next(iter(resumed)).tolist() == [24, 25, 26]
    # the batch yielded and the one read ahead: 2 x 3 samples of this process (x 2 processes for a stream)
    assert (dataset.loaded if dataset_kind == "map" else dataset.reads) == (6 if dataset_kind == "map" else 12)


def test_a_loop_left_with_break_keeps_its_position_then_restarts_the_epoch():
    loader = prepare_data_loader(DataLoader(range(10), batch_size=2))
    for index, _ in enumerate(loader):
        if index == 2:
            break
    assert loader.state_dict()["batches_yielded"] == 3 and loader.state_dict()["epoch"] == 0
    assert values(loader) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_dispatcher_resumes_an_iterable_dataset_from_its_own_state():
    def make(dataset):
        return prepare_data_loader(DataLoader(dataset, batch_size=2), dispatch_batches=True)

    full = values(make(ResumableStream(11)))
    loader = make(ResumableStream(11))
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(2)]
    dataset = ResumableStream(11)
    resumed = make(dataset)
    resumed.load_state_dict(loader.state_dict())
    assert head + values(resumed) == full
    assert dataset.reads == 11 - 4


def test_skip_first_batches_without_automatic_batching():
    assert list(skip_first_batches(DataLoader(list(range(6)), batch_size=None), 4)) == [4, 5]
    prepared = prepare_data_loader(DataLoader(list(range(6)), batch_size=None), num_processes=2, process_index=1)
    assert list(skip_first_batches(prepared, 1)) == [3, 5]
