"""Collectives checked by default: every mismatch ends in DistributedOperationException on every rank, naming
every rank's inputs, the group stays usable, and gather takes tensors whose first dimension differs.

Run with `hasten launch -n 2` (tests/collectives/test_safe_collectives.py).
"""
import torch

from hasten.evaluation import gather_for_metrics
from hasten.state import PartialState
from hasten.utils.environment import patch_environment
from hasten.utils.operations import (
    DistributedOperationException, broadcast, broadcast_object_list, collective_checks, collective_checks_enabled,
    gather, gather_object, pad_across_processes, reduce,
)

RAISED = []


def expect_mismatch(name, call, *fragments):
    """``call`` raises DistributedOperationException naming each fragment; then a collective still works."""
    try:
        call()
    except DistributedOperationException as error:
        message = str(error)
        for fragment in fragments:
            assert fragment in message, (name, fragment, message)
    else:
        raise AssertionError(f"{name}: no DistributedOperationException")
    state = PartialState()
    everyone = gather(torch.tensor([state.process_index]))  # the group is still in step
    assert everyone.tolist() == list(range(state.num_processes)), (name, everyone)
    RAISED.append(name)


def each(n, text):
    return [text(r) for r in range(n)]


def check_tensor_mismatches(n, rank):
    """shape, dtype, dict keys, list length and non-tensor leaves, for each tensor collective."""
    dtypes = [torch.float32, torch.int64]
    names = ["float32", "int64"]
    collectives = {
        "gather": gather,
        "gather_for_metrics": gather_for_metrics,
        "reduce": lambda data: reduce(data, "sum"),
        "broadcast": lambda data: broadcast(data, from_process=0),
    }
    for name, call in collectives.items():
        other_dim = torch.zeros(2, 3 + rank)  # every dimension but the first must match for gathers
        expect_mismatch(f"{name} shape", lambda: call({"x": other_dim}), f"`{name}`",
                        *each(n, lambda r: f"process {r}: {{'x': float32[2, {3 + r}]}}"))
        typed = torch.zeros(2, 3, dtype=dtypes[rank % 2])
        expect_mismatch(f"{name} dtype", lambda: call([typed]),
                        *each(n, lambda r: f"process {r}: [{names[r % 2]}[2, 3]]"))
        keyed = {f"k{rank}": torch.zeros(2)}
        expect_mismatch(f"{name} keys", lambda: call(keyed),
                        *each(n, lambda r: f"process {r}: {{'k{r}': float32[2]}}"))
        listed = [torch.zeros(2)] * (rank + 1)
        expect_mismatch(f"{name} list length", lambda: call(listed),
                        *each(n, lambda r: f"process {r}: [{', '.join(['float32[2]'] * (r + 1))}]"))
        if name != "gather_for_metrics":  # there a non-tensor leaf means an object gather: see below
            leaf = [torch.zeros(2), "text" if rank == 1 else torch.zeros(2)]
            expect_mismatch(f"{name} non-tensor leaf", lambda: call(leaf),
                            "process 0: [float32[2], float32[2]]", "process 1: [float32[2], <str>]")
    # reduce and broadcast compare every dimension, the first too, and their source / reduction
    rows = torch.zeros(2 + rank, 3)
    expect_mismatch("reduce first dim", lambda: reduce(rows), *each(n, lambda r: f"process {r}: float32[{2 + r}, 3]"))
    expect_mismatch("broadcast first dim", lambda: broadcast(rows),
                    *each(n, lambda r: f"process {r}: float32[{2 + r}, 3]"))
    expect_mismatch("broadcast source", lambda: broadcast(torch.zeros(2), from_process=rank),
                    *each(n, lambda r: f"from_process={r}"))
    expect_mismatch("reduce op", lambda: reduce(torch.zeros(2), "sum" if rank else "max"),
                    "reduction='max'", "reduction='sum'")
    # gather_for_metrics: tensors on one process, other objects on another
    mixed = torch.zeros(2) if rank == 0 else ["a", "b"]
    expect_mismatch("gather_for_metrics tensors vs objects", lambda: gather_for_metrics(mixed),
                    "process 0: float32[2]", "process 1: a list of 2 items")
    # pad_across_processes: number of dimensions, dtype, keys, list length, non-tensor leaf
    expect_mismatch("pad ndim", lambda: pad_across_processes(torch.zeros(*([2] * (rank + 1)))),
                    *each(n, lambda r: f"process {r}: float32{[2] * (r + 1)}"))
    expect_mismatch("pad dtype", lambda: pad_across_processes(torch.zeros(2 + rank, dtype=dtypes[rank % 2])),
                    *each(n, lambda r: f"process {r}: {names[r % 2]}[{2 + r}]"))
    expect_mismatch("pad keys", lambda: pad_across_processes({f"k{rank}": torch.zeros(2)}),
                    *each(n, lambda r: f"process {r}: {{'k{r}': float32[2]}}"))
    expect_mismatch("pad list length", lambda: pad_across_processes([torch.zeros(2)] * (rank + 1)),
                    "process 0: [float32[2]]", "process 1: [float32[2], float32[2]]")
    odd_leaf = [torch.zeros(2), 5 if rank else torch.zeros(2)]
    expect_mismatch("pad non-tensor leaf", lambda: pad_across_processes(odd_leaf), "process 1: [float32[2], <int>]")
    # different collectives at the same point
    expect_mismatch("different collectives", lambda: gather(torch.zeros(2)) if rank == 0 else reduce(torch.zeros(2)),
                    "different collectives", "(in `gather`)", "(in `reduce`)")


def check_object_mismatches(n, rank):
    expect_mismatch("gather_object kind", lambda: gather_object([rank] if rank == 0 else {"rank": rank}),
                    "`gather_object`", "process 0: a list of 1 items", "process 1: a dict")
    unpicklable = (lambda: None) if rank == 1 else "fine"
    expect_mismatch("gather_object unpicklable", lambda: gather_object([unpicklable]),
                    "process 1: a list of 1 items that cannot be pickled")
    expect_mismatch("broadcast_object_list length", lambda: broadcast_object_list([None] * (rank + 1)),
                    "`broadcast_object_list`", *each(n, lambda r: f"process {r}: list of {r + 1} objects"))
    expect_mismatch("broadcast_object_list source", lambda: broadcast_object_list([None], from_process=rank),
                    *each(n, lambda r: f"process {r}: list of 1 objects from process {r}"))
    sent = [lambda: None] if rank == 0 else [None]
    expect_mismatch("broadcast_object_list unpicklable", lambda: broadcast_object_list(sent),
                    "process 0: list of 1 objects from process 0, which cannot be pickled")
    # valid calls still work, in the checked path
    assert gather_object([f"r{rank}"]) == each(n, lambda r: f"r{r}")
    assert gather_object({"rank": rank}) == each(n, lambda r: {"rank": r})
    box = [{"lr": 0.1}, "x"] if rank == 1 else [None, None]
    assert broadcast_object_list(box, from_process=1) == [{"lr": 0.1}, "x"]
    bulky = [f"{rank}:" + "x" * 20000]  # past what rides in the header: the second exchange
    assert [item[:2] for item in gather_object(bulky)] == each(n, lambda r: f"{r}:")
    assert broadcast_object_list(list(bulky), from_process=1)[0] == "1:" + "x" * 20000
    try:
        broadcast_object_list([None], from_process=n)
    except ValueError as error:
        assert f"[0, {n - 1}]" in str(error)
    else:
        raise AssertionError("out-of-range from_process accepted")


def check_uneven_gathers(n, rank):
    rows = 3 if rank == 0 else 0 if rank == 1 else rank  # process 1 has no rows at all
    mine = {"logits": torch.full((rows, 2), float(rank)), "ids": torch.arange(rows) + 10 * rank,
            "loss": torch.tensor(float(rank)), "mask": torch.ones(rows, 4, dtype=torch.bool)}
    expected_rows = [3 if r == 0 else 0 if r == 1 else r for r in range(n)]
    for call in (gather, gather_for_metrics):
        out = call(mine)
        assert out["logits"].shape == (sum(expected_rows), 2), out["logits"].shape
        assert out["logits"][:, 0].tolist() == [float(r) for r in range(n) for _ in range(expected_rows[r])]
        assert out["ids"].tolist() == [i + 10 * r for r in range(n) for i in range(expected_rows[r])]
        assert out["loss"].tolist() == [float(r) for r in range(n)]
        assert out["mask"].dtype == torch.bool and out["mask"].shape == (sum(expected_rows), 4)
    many = [torch.full((i + rank, 1), i) for i in range(20)]  # more sizes than the header holds
    out = gather(many)
    for i, tensor in enumerate(out):
        assert tensor.shape == (sum(i + r for r in range(n)), 1) and (tensor == i).all(), (i, tensor.shape)
    same_sized = gather([torch.full((i, 1), i) for i in range(20)])  # hashed sizes agree: no second exchange
    assert [t.shape[0] for t in same_sized] == [i * n for i in range(20)]
    assert gather(torch.zeros(0, 3)).shape == (0, 3)  # empty everywhere: skipped alike everywhere
    # past the 16 KiB that ride in the header: the data takes a second collective (padded when uneven)
    big = {"x": torch.full((1200 + 7 * rank, 4), float(rank)), "n": torch.tensor(rank)}
    out = gather(big)
    assert out["x"].shape == (sum(1200 + 7 * r for r in range(n)), 4) and out["n"].tolist() == list(range(n))
    assert out["x"][:, 0].tolist() == [float(r) for r in range(n) for _ in range(1200 + 7 * r)]
    large = torch.arange(5000.0) + rank
    assert torch.equal(reduce(large, "sum"), sum(torch.arange(5000.0) + r for r in range(n)))
    assert torch.equal(reduce(large, "max"), torch.arange(5000.0) + n - 1)
    received = large.clone()
    broadcast(received, from_process=1)
    assert torch.equal(received, torch.arange(5000.0) + 1)
    small = {"i": torch.tensor([rank, 2], dtype=torch.int32), "b": torch.tensor([True, rank == 0])}
    summed = reduce(small, "sum")  # small: reduced from the copies in the header, dtypes as all_reduce gives
    assert summed["i"].dtype == torch.int32 and summed["i"].tolist() == [sum(range(n)), 2 * n]
    assert summed["b"].dtype == torch.int64 and summed["b"].tolist() == [n, 1]
    assert reduce(small, "min")["b"].tolist() == [True, n == 1]


def check_opt_out(n, rank):
    state = PartialState()
    assert collective_checks_enabled()  # the default: on
    with patch_environment(hasten_debug_mode="0"):
        assert not collective_checks_enabled()
        keyed = {f"k{rank}": torch.full((2,), float(rank))}  # unchecked: the keys are not compared
        assert gather(keyed)[f"k{rank}"].tolist() == [float(r) for r in range(n) for _ in range(2)]
        state.debug = True  # PartialState().debug (HASTEN_DEBUG_MODE=1 at start-up) turns them back on
        try:
            assert collective_checks_enabled()
        finally:
            state.debug = False
    with patch_environment(accelerate_debug_mode="false"):
        assert not collective_checks_enabled()
    with collective_checks(False):  # the in-code switch
        assert not collective_checks_enabled()
        assert reduce(torch.tensor([1.0 + rank]), "sum").tolist() == [sum(1.0 + r for r in range(n))]
        assert gather_object([rank]) == list(range(n))
        assert broadcast_object_list([rank], from_process=1) == [1]
        assert broadcast_object_list([rank]) == [0]
        empty = torch.zeros(0, 2)
        assert gather(empty).shape == (0, 2) and reduce(empty).shape == (0, 2)
        with patch_environment(hasten_debug_mode="1"):
            assert not collective_checks_enabled()  # the explicit switch wins
    assert collective_checks_enabled()


def main():
    state = PartialState()
    n, rank = state.num_processes, state.process_index
    assert n == 2 and state.use_distributed and state.backend == "gloo", state
    check_tensor_mismatches(n, rank)
    check_object_mismatches(n, rank)
    check_uneven_gathers(n, rank)
    check_opt_out(n, rank)
    state.wait_for_everyone()
    if state.is_main_process:
        print(f"check_safe_collectives OK: {len(RAISED)} mismatches raised on every rank", flush=True)
    state.destroy_process_group()


if __name__ == "__main__":
    main()
