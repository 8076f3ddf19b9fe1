"""The per-batch path of prepared loaders does no work a plain ``DataLoader`` loop does not do (issue 10, 6a).

No timings here: the checks count the calls that used to cost time per batch (``send_to_device`` on batches
already on the device, ``DataLoader.__setattr__`` for the position) and check that behaviour is unchanged.
"""
from __future__ import annotations

import copy
from collections import namedtuple

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import hasten.data.dispatcher as dispatcher_module
import hasten.data.shard_loader as shard_module
from hasten.data import prepare_data_loader
from hasten.data.placement import as_device, on_device

Pair = namedtuple("Pair", "x y")


def _counting_send(monkeypatch, module) -> list:
    calls = []
    real = module.send_to_device

    def counting(batch, device, non_blocking=False, skip_keys=None):
        calls.append(device)
        return real(batch, device, non_blocking=non_blocking, skip_keys=skip_keys)

    monkeypatch.setattr(module, "send_to_device", counting)
    return calls


def _dataset(count: int = 40):
    return TensorDataset(torch.arange(count * 3, dtype=torch.float32).view(count, 3), torch.arange(count))


def _nested(samples):
    xs, ys = zip(*samples)
    return {"pair": Pair(torch.stack(xs), torch.stack(ys)), "names": [f"s{int(y)}" for y in ys], "n": len(ys)}


def _same(left, right) -> bool:
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and left.device == right.device and torch.equal(left, right)
    if isinstance(left, dict):
        return type(left) is type(right) and left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, (list, tuple)):
        return type(left) is type(right) and len(left) == len(right) and all(map(_same, left, right))
    return left == right


@pytest.mark.parametrize("collate_fn", [None, _nested])
def test_batches_already_on_the_device_are_not_handed_to_send_to_device(monkeypatch, collate_fn):
    calls = _counting_send(monkeypatch, shard_module)
    options = {"batch_size": 4, "collate_fn": collate_fn} if collate_fn else {"batch_size": 4}
    placed = prepare_data_loader(DataLoader(_dataset(), **options), num_processes=2, process_index=1,
                                 put_on_device=True, device=torch.device("cpu"))
    unplaced = prepare_data_loader(DataLoader(_dataset(), **options), num_processes=2, process_index=1)
    batches, expected = list(placed), list(unplaced)
    assert calls == []
    assert len(batches) == len(expected) == 5
    assert all(_same(a, b) for a, b in zip(batches, expected))
    assert placed.end_of_dataloader and placed.remainder == 8


def test_batches_on_another_device_are_still_moved(monkeypatch):
    calls = _counting_send(monkeypatch, shard_module)
    loader = prepare_data_loader(DataLoader(_dataset(), batch_size=4, collate_fn=_nested), num_processes=2,
                                 process_index=0, put_on_device=True, device="meta")
    batches = list(loader)
    assert len(calls) == len(batches) == 5
    assert all(b["pair"].x.device.type == "meta" and b["pair"].y.device.type == "meta" for b in batches)
    assert isinstance(batches[0]["pair"], Pair) and batches[0]["names"] == ["s0", "s1", "s2", "s3"]


def test_objects_with_their_own_to_are_still_given_the_device(monkeypatch):
    class Moves:
        def __init__(self, values):
            self.values, self.moved_to = values, []

        def to(self, device, non_blocking=False):
            self.moved_to.append(device)
            return self

    calls = _counting_send(monkeypatch, shard_module)
    loader = prepare_data_loader(DataLoader(_dataset(8), batch_size=4, collate_fn=lambda s: [Moves(s)]),
                                 put_on_device=True, device="cpu")
    batches = list(loader)
    assert len(calls) == 2
    assert [b[0].moved_to for b in batches] == [["cpu"], ["cpu"]]  # the device exactly as given, as before


def test_a_dispatched_batch_already_on_the_device_is_kept(monkeypatch):
    calls = _counting_send(monkeypatch, dispatcher_module)
    loader = prepare_data_loader(DataLoader(_dataset(12), batch_size=4), dispatch_batches=True, put_on_device=True,
                                 device="cpu", num_processes=1, process_index=0)
    batches = list(loader)
    assert calls == [] and len(batches) == 3
    assert torch.equal(batches[-1][1], torch.arange(8, 12))


def test_on_device_says_yes_only_when_send_to_device_would_change_nothing():
    cpu, tensor = as_device("cpu"), torch.ones(2)

    class WithTo(dict):
        def to(self, device):
            return self

    assert on_device([tensor, (tensor, {"a": tensor, "b": 3, "c": "text", "d": None})], cpu)
    assert on_device(Pair(tensor, [1, 2]), cpu)
    assert not on_device([tensor, torch.ones(2, device="meta")], cpu)
    assert not on_device({"a": {"b": torch.ones(1, device="meta")}}, cpu)
    assert not on_device(WithTo(a=tensor), cpu)  # a mapping with its own .to (BatchEncoding) is moved by it
    assert not on_device(torch.nn.Parameter(tensor), cpu)  # a tensor subclass: its .to is called as before
    assert as_device(torch.device("cpu")) == cpu and as_device("meta") == torch.device("meta")


def test_no_per_batch_setattr_or_deepcopy_and_the_position_is_still_tracked(monkeypatch):
    counted = {"setattr": 0, "deepcopy": 0}
    counting = [False]  # only inside the loader's next(), not in state_dict() or the test itself
    real_setattr, real_deepcopy = DataLoader.__setattr__, copy.deepcopy

    def counting_setattr(self, name, value):
        counted["setattr"] += counting[0]
        real_setattr(self, name, value)

    def counting_deepcopy(*args, **kwargs):
        counted["deepcopy"] += counting[0]
        return real_deepcopy(*args, **kwargs)

    def calls_in_a_pass(batches: int) -> dict:
        loader = prepare_data_loader(DataLoader(_dataset(batches * 2), batch_size=2, shuffle=True), put_on_device=True,
                                     rng_types=["generator"], device="cpu")
        counted.update(setattr=0, deepcopy=0)
        iterator = iter(loader)
        for taken in range(1, batches + 1):
            counting[0] = True
            next(iterator)
            counting[0] = False
            assert loader.state_dict()["batches_yielded"] == (taken if taken < batches else 0)
        assert loader.end_of_dataloader and loader.state_dict()["epoch"] == 1
        assert next(iterator, None) is None
        return dict(counted)

    monkeypatch.setattr(DataLoader, "__setattr__", counting_setattr)
    monkeypatch.setattr(copy, "deepcopy", counting_deepcopy)
    few, many = calls_in_a_pass(5), calls_in_a_pass(40)
    assert few == many  # a constant per pass (its start and end), nothing per batch
    assert many["deepcopy"] == 0


@pytest.mark.parametrize("cheap_is_checked_equal", [True, False])
def test_the_epochs_end_leaves_the_generator_as_a_plain_random_sampler_does(monkeypatch, cheap_is_checked_equal):
    import hasten.data.index_order as index_order

    size = 24
    if not cheap_is_checked_equal:  # a torch version where the cheap draw differs: randperm itself is drawn
        monkeypatch.setitem(index_order._CHEAP_DISCARD, size, False)
    plain_generator, our_generator = torch.Generator(), torch.Generator()
    plain_generator.manual_seed(3)
    our_generator.manual_seed(3)
    plain = DataLoader(range(size), batch_size=4, shuffle=True, generator=plain_generator)
    ours = prepare_data_loader(DataLoader(range(size), batch_size=4, shuffle=True, generator=our_generator))
    for _ in range(3):  # the same orders epoch after epoch, so the generator moved on exactly as torch's does
        assert [b.tolist() for b in ours] == [b.tolist() for b in plain]
        assert torch.equal(ours.batch_sampler.sampler.generator.get_state(), plain_generator.get_state())
    assert index_order._CHEAP_DISCARD[size] is cheap_is_checked_equal


def test_discard_permutation_matches_randperm_for_odd_sizes():
    from hasten.data.index_order import discard_permutation

    for count in (0, 1, 2, 7, 1000):
        ours, reference = torch.Generator(), torch.Generator()
        ours.manual_seed(count)
        reference.manual_seed(count)
        discard_permutation(count, ours)
        torch.randperm(count, generator=reference)
        assert torch.equal(ours.get_state(), reference.get_state()), count
