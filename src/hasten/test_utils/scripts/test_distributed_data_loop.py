"""Prepared data loaders when the batch size does not divide the data set, on exactly two processes (Accelerate's
multi-device suite launches this file, ``test_utils/scripts/test_distributed_data_loop.py``).

Checked, each on both processes:

- ``even_batches=True`` (the default) pads the last batches so every process gets as many batches of the same size;
  ``even_batches=False`` leaves the uneven tail (process 1 then gets fewer or smaller batches);
- ``join_uneven_inputs`` lets a DDP model train on those uneven loaders without hanging, overrides ``even_batches``
  of the prepared map-style loaders only while it is open (also next to a loader on an iterable data set), and warns
  where it cannot act: ``even_batches`` on an iterable loader ("only supported for map-style datasets"), a backend
  other than DDP ("only supported for multi-GPU");
- a pickled Accelerator comes back with the same state;
- every element of a data set is seen exactly once across the processes (``gather_for_metrics`` drops the
  padding) for loaders with and without shuffling, with a ``batch_sampler``, and with a ``BatchSampler`` passed as
  ``sampler`` (``batch_size=None``), each read by worker processes;
- a stateful loader (``use_stateful_dataloader=True``, on a shuffled map-style and an iterable data set) resumed
  from ``state_dict()`` or from ``save_state`` gives exactly the batches it had not yet given.

Run: ``hasten launch -n 2 <this file>``.
"""
from __future__ import annotations

import pickle
import tempfile
import warnings
from unittest.mock import Mock

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    TensorDataset,
)

from hasten.accelerator import Accelerator
from hasten.config.data import DataLoaderConfiguration
from hasten.config.enums import DistributedType

NUM_ELEMENTS, BATCH_SIZE, NUM_WORKERS = 22, 4, 2


class Records(Dataset):
    """``NUM_ELEMENTS`` dict records (index, label, a random number); indexable by an int or a list of ints (the
    latter for a ``BatchSampler`` given as ``sampler``)."""

    def __len__(self):
        return NUM_ELEMENTS

    def _record(self, index: int) -> dict:
        return {"index": index, "label": index % 2, "noise": torch.rand(1).item()}

    def __getitem__(self, index):
        return self._record(index) if isinstance(index, int) else [self._record(i) for i in index]


class Stream(IterableDataset):
    def __init__(self, values):
        self.values = values

    def __iter__(self):
        yield from self.values


def two_process_accelerator(**loader_options) -> Accelerator:
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(**loader_options))
    if accelerator.num_processes != 2:
        raise SystemExit(f"test_distributed_data_loop runs on exactly 2 processes, got {accelerator.num_processes}: "
                         "hasten launch -n 2 test_distributed_data_loop.py")
    return accelerator


def numbers_loader(accelerator, size: int, batch_size: int, iterable=False, shuffle=False):
    values = torch.arange(size)
    if shuffle:
        values = values[torch.randperm(size)]
    dataset = Stream(values) if iterable else TensorDataset(values)
    return accelerator.prepare(DataLoader(dataset, batch_size=batch_size))


def expect_batch_sizes(accelerator, size: int, batch_size: int, per_process: tuple[list, list]) -> None:
    sizes = [len(batch[0]) for batch in numbers_loader(accelerator, size, batch_size)]
    expected = per_process[accelerator.process_index]
    assert sizes == expected, f"process {accelerator.process_index}: batch sizes {sizes}, expected {expected}"


def check_even_batches() -> None:
    accelerator = two_process_accelerator()
    expect_batch_sizes(accelerator, 3, 1, ([1, 1], [1, 1]))  # one more batch for process 1, padded
    expect_batch_sizes(accelerator, 7, 2, ([2, 2], [2, 2]))  # the last batch of process 1 padded to full size
    accelerator = two_process_accelerator(even_batches=False)
    expect_batch_sizes(accelerator, 3, 1, ([1, 1], [1]))
    expect_batch_sizes(accelerator, 7, 2, ([2, 2], [2, 1]))


def check_join_uneven_inputs() -> None:
    accelerator = two_process_accelerator(even_batches=False)
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    seen = []
    with accelerator.join_uneven_inputs([model]):
        for step, batch in enumerate(numbers_loader(accelerator, 3, 1)):
            model(batch[0].float()[:, None]).sum().backward()
            seen.append(step)
    accelerator.wait_for_everyone()
    assert seen == ([0, 1], [0])[accelerator.process_index], seen


def check_join_overrides_even_batches() -> None:
    accelerator = two_process_accelerator(even_batches=True)
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    train, valid = numbers_loader(accelerator, 3, 1), numbers_loader(accelerator, 3, 1)
    with accelerator.join_uneven_inputs([model], even_batches=False):
        inside = (train.batch_sampler.even_batches, valid.batch_sampler.even_batches)
    assert inside == (False, False) and (train.batch_sampler.even_batches, valid.batch_sampler.even_batches) == (
        True, True), inside

    # next to a loader on an iterable data set (which has no batch sampler to change), the map-style one still is
    accelerator = two_process_accelerator(even_batches=True)
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    numbers_loader(accelerator, 3, 1, iterable=True)
    mapped = numbers_loader(accelerator, 3, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([model], even_batches=False):
            inside = mapped.batch_sampler.even_batches
    assert inside is False and mapped.batch_sampler.even_batches is True
    assert any("only supported for map-style datasets" in str(w.message) for w in caught), [
        str(w.message) for w in caught]


def check_join_warns_without_ddp() -> None:
    accelerator = two_process_accelerator()
    kept = accelerator.state.distributed_type
    accelerator.state.distributed_type = DistributedType.FSDP
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with accelerator.join_uneven_inputs([Mock()]):
                pass
    finally:
        accelerator.state.distributed_type = kept
    assert any(issubclass(w.category, UserWarning) and "only supported for multi-GPU" in str(w.message)
               for w in caught), [str(w.message) for w in caught]


def check_pickled_accelerator() -> None:
    accelerator = two_process_accelerator()
    accelerator.prepare(numbers_loader(accelerator, 32, 4))
    assert pickle.loads(pickle.dumps(accelerator)).state.__dict__ == accelerator.state.__dict__


def check_every_element_once(accelerator, loader, name: str) -> None:
    seen = []
    for batch in accelerator.prepare(loader):
        indices, _ = accelerator.gather_for_metrics((batch["index"], batch["label"]))
        seen.extend(indices.cpu().tolist())
    assert sorted(seen) == list(range(NUM_ELEMENTS)), f"{name}: elements seen {sorted(seen)}"


def check_loader_kinds(accelerator) -> None:
    records = Records()
    check_every_element_once(accelerator, DataLoader(records, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS),
                             "shuffle=False")
    check_every_element_once(accelerator, DataLoader(records, batch_size=BATCH_SIZE, shuffle=True,
                                                     num_workers=NUM_WORKERS), "shuffle=True")
    batches = BatchSampler(RandomSampler(records), batch_size=BATCH_SIZE, drop_last=False)
    check_every_element_once(accelerator, DataLoader(records, batch_sampler=batches, num_workers=NUM_WORKERS),
                             "batch_sampler")
    batches = BatchSampler(RandomSampler(records), batch_size=BATCH_SIZE, drop_last=False)
    check_every_element_once(accelerator, DataLoader(records, sampler=batches, batch_size=None,
                                                     collate_fn=torch.utils.data.default_collate,
                                                     num_workers=NUM_WORKERS), "BatchSampler as sampler")


def _resumed_equals_rest(accelerator, iterable: bool, through_checkpoint: bool) -> None:
    loader = numbers_loader(accelerator, 32 * accelerator.num_processes, 4, iterable=iterable, shuffle=True)
    rest, saved_at = [], 2
    with tempfile.TemporaryDirectory() as folder:
        for step, batch in enumerate(loader):
            if step == saved_at and through_checkpoint:
                accelerator.save_state(folder)
            elif step == saved_at:
                state = loader.state_dict()
            elif step > saved_at:
                rest.append(batch)
        if through_checkpoint:
            accelerator.load_state(folder)
        else:
            loader.load_state_dict(state)
        resumed = list(loader)
    how = f"{'iterable' if iterable else 'map-style'} data set, {'save_state' if through_checkpoint else 'state_dict'}"
    rest, resumed = accelerator.gather(rest), accelerator.gather(resumed)
    assert len(resumed) == len(rest), f"{how}: {len(resumed)} batches after the resume, expected {len(rest)}"
    for expected, got in zip(rest, resumed):
        assert all(torch.equal(a, b) for a, b in zip(expected, got)), f"{how}: {got} after the resume, not {expected}"


def check_stateful_resume(accelerator) -> None:
    kept = accelerator.dataloader_config
    accelerator.dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=True)
    try:
        for iterable in (True, False):
            for through_checkpoint in (False, True):
                _resumed_equals_rest(accelerator, iterable, through_checkpoint)
    finally:
        accelerator.dataloader_config = kept


def main() -> None:
    accelerator = two_process_accelerator()
    torch.manual_seed(accelerator.process_index)
    for check in (check_even_batches, check_join_uneven_inputs, check_join_overrides_even_batches,
                  check_join_warns_without_ddp, check_pickled_accelerator):
        accelerator.print(check.__name__)
        check()
    accelerator = two_process_accelerator()
    for check in (check_loader_kinds, check_stateful_resume):
        accelerator.print(check.__name__)
        check(accelerator)
    accelerator.print("DISTRIBUTED DATA LOOP PASSED")
    accelerator.end_training()


if __name__ == "__main__":
    main()
