"""What process 0 of a DataLoaderDispatcher sends each process (pure planning, no communication)."""
import collections

import pytest
import torch

from hasten.data.dispatch_plan import (SLICE, WHOLE, CannotJoin, batch_size_of, join_batches, plan_step,
                                       process_bounds, slice_batch)

Pair = collections.namedtuple("Pair", ["x", "y"])


def batch(start, size, width=2, text=True):
    rows = torch.arange(start, start + size)
    result = {"x": rows[:, None].expand(size, width).clone(), "label": rows.clone()}
    if text:
        result["text"] = [f"t{i}" for i in range(start, start + size)]
    return result


def shares(plan, processes):
    """What each process takes from a plan (as the dispatcher does)."""
    if plan.mode == WHOLE:
        return [plan.payload[i] if i < len(plan.payload) else None for i in range(processes)]
    parts = [process_bounds(plan.total, processes, i) for i in range(processes)]
    return [slice_batch(plan.payload, part, plan.total) if part.start < part.stop else None for part in parts]


def rows(share):
    return None if share is None else share["label"].tolist()


def test_batch_size_of_finds_tensors_then_lists():
    assert batch_size_of(batch(0, 3)) == 3
    assert batch_size_of({"words": ["a", "b"], "ids": [[1], [2, 3]]}) == 2
    assert batch_size_of({"meta": 7}) is None


def test_join_and_slice_tensors_and_strings():
    joined = join_batches([batch(0, 2), batch(2, 2)])
    assert joined["label"].tolist() == [0, 1, 2, 3] and joined["text"] == ["t0", "t1", "t2", "t3"]
    part = slice_batch(joined, slice(1, 3))
    assert part["x"].tolist() == [[1, 1], [2, 2]] and part["text"] == ["t1", "t2"]


def test_join_keeps_namedtuples_and_per_batch_fields():
    joined = join_batches([Pair(torch.zeros(2), "same"), Pair(torch.ones(3), "same")])
    assert isinstance(joined, Pair) and joined.x.tolist() == [0, 0, 1, 1, 1] and joined.y == "same"
    with pytest.raises(CannotJoin, match="per-batch field differs"):
        join_batches([Pair(torch.zeros(2), "a"), Pair(torch.ones(2), "b")])
    with pytest.raises(CannotJoin, match="cannot be joined"):
        join_batches([torch.zeros(2, 3), torch.zeros(2, 4)])


def test_process_bounds_never_drop_samples():
    for total in range(0, 12):
        parts = [process_bounds(total, 3, i) for i in range(3)]
        assert [i for part in parts for i in range(part.start, part.stop)] == list(range(total))
        assert max(p.stop - p.start for p in parts) - min(p.stop - p.start for p in parts) <= 1


def test_equal_batches_give_each_process_its_batch():
    plan = plan_step([batch(0, 4), batch(4, 4)], split_batches=False, num_processes=2, is_last=False, complete=True,
                     first_samples=None)
    assert plan.mode == SLICE and [rows(s) for s in shares(plan, 2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_last_step_is_completed_with_the_first_samples_like_the_reference():
    # 3 real samples for 2 processes: [8, 9, 10] + first sample 0 -> [8, 9] and [10, 0]
    plan = plan_step([batch(8, 2), batch(10, 1)], split_batches=False, num_processes=2, is_last=True, complete=True,
                     first_samples=batch(0, 2))
    assert [rows(s) for s in shares(plan, 2)] == [[8, 9], [10, 0]]
    assert plan.real == 3


def test_last_step_without_completion_is_shared_without_repeats():
    plan = plan_step([batch(8, 2), batch(10, 1)], split_batches=False, num_processes=2, is_last=True, complete=False,
                     first_samples=batch(0, 2))
    assert [rows(s) for s in shares(plan, 2)] == [[8, 9], [10]]
    single = plan_step([batch(8, 1)], split_batches=False, num_processes=3, is_last=True, complete=False,
                       first_samples=None)
    assert [rows(s) for s in shares(single, 3)] == [[8], None, None]


def test_tiny_data_is_cycled_to_fill_every_process():
    plan = plan_step([batch(0, 1)], split_batches=False, num_processes=4, is_last=True, complete=True,
                     first_samples=batch(0, 1))
    assert [rows(s) for s in shares(plan, 4)] == [[0], [0], [0], [0]]


def test_batches_that_cannot_be_joined_go_whole():
    # padded sequences of different lengths: process i gets batch i
    first, second = {"ids": torch.zeros(2, 5)}, {"ids": torch.ones(2, 7)}
    plan = plan_step([first, second], split_batches=False, num_processes=2, is_last=False, complete=True,
                     first_samples=None)
    assert plan.mode == WHOLE and shares(plan, 2) == [first, second]
    last = plan_step([first, second], split_batches=False, num_processes=3, is_last=True, complete=True,
                     first_samples=None)
    assert [share["ids"][0, 0].item() for share in shares(last, 3)] == [0, 1, 0] and last.real == 4
    uneven = plan_step([first, second], split_batches=False, num_processes=3, is_last=True, complete=False,
                       first_samples=None)
    assert shares(uneven, 3)[2] is None


def test_uneven_batch_sizes_before_the_end_go_whole_instead_of_dropping_samples():
    plan = plan_step([batch(0, 4), batch(4, 3)], split_batches=False, num_processes=2, is_last=False, complete=True,
                     first_samples=None)
    assert plan.mode == WHOLE and [rows(s) for s in shares(plan, 2)] == [[0, 1, 2, 3], [4, 5, 6]]


def test_split_step_is_cut_in_slices_and_completed_at_the_end():
    plan = plan_step([batch(0, 4)], split_batches=True, num_processes=2, is_last=False, complete=True,
                     first_samples=None)
    assert [rows(s) for s in shares(plan, 2)] == [[0, 1], [2, 3]]
    last = plan_step([batch(4, 3)], split_batches=True, num_processes=2, is_last=True, complete=True,
                     first_samples=batch(0, 2))
    assert [rows(s) for s in shares(last, 2)] == [[4, 5], [6, 0]]


def test_split_of_an_unsliceable_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="this batch cannot be sliced"):
        plan_step([{"meta": "x"}], split_batches=True, num_processes=2, is_last=False, complete=True,
                  first_samples=None)


def test_custom_slice_function_is_used_for_completion():
    calls = []

    def slicer(data, part, process_index=None, num_processes=None):
        calls.append(part)
        return slice_batch(data, part)

    plan_step([batch(0, 3)], split_batches=True, num_processes=2, is_last=True, complete=True,
              first_samples=batch(0, 2), slice_fn=slicer)
    assert calls == [slice(0, 1)]
