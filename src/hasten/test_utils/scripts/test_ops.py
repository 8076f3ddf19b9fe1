"""Every collective of ``hasten.utils.operations`` across real processes (Accelerate's
``test_utils.scripts.test_ops``): run with ``hasten launch -n N <this file>`` (N >= 2), or call ``main()`` through
``debug_launcher``.

Each rank builds its inputs from its rank number, so every expected result is built here independently, from
plain torch, out of the inputs all ranks would have made.
"""
from __future__ import annotations

import collections
import warnings
from collections import OrderedDict, namedtuple

import torch

from hasten.core.environment import is_debug_mode
from hasten.state import PartialState
from hasten.collectives.checks import DistributedOperationException
from hasten.collectives.operations import (
    broadcast, broadcast_object_list, gather, gather_object, pad_across_processes, reduce,
)

Pair = namedtuple("Pair", ["x", "y"])


class Batch(collections.abc.Mapping):
    """A Mapping that is not a dict (like transformers' BatchEncoding)."""

    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


def make(rank: int, shape=(2, 3), dtype=torch.float32):
    """The tensor rank `rank` contributes: distinct values per rank and position."""
    values = torch.arange(int(torch.Size(shape).numel()), dtype=torch.float64).reshape(shape) + 100 * rank
    return values.to(dtype)


def nested(rank: int):
    return {
        "a": make(rank),
        "b": [make(rank, (2,), torch.int64), make(rank, (2, 2), torch.bfloat16)],
        "c": Pair(x=make(rank, (2, 1)), y=make(rank, (2,), torch.int32)),
        "d": OrderedDict(z=make(rank, (2, 4), torch.float64)),
        "e": Batch({"m": make(rank, (2,)) > 100}),
    }


def same(actual, expected):
    """Structures, container types, dtypes and values equal."""
    assert type(actual) is type(expected), (type(actual), type(expected))
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual, expected)
        assert torch.equal(actual, expected), (actual, expected)
    elif isinstance(expected, collections.abc.Mapping):
        assert list(actual.keys()) == list(expected.keys())
        for key in expected:
            same(actual[key], expected[key])
    else:
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            same(a, e)


def leafwise(function, structures):
    """Combine a list of same-shaped structures leaf by leaf with `function(list_of_leaves)`."""
    first = structures[0]
    if isinstance(first, torch.Tensor):
        return function(structures)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*[leafwise(function, [s[i] for s in structures]) for i in range(len(first))])
    if isinstance(first, (list, tuple)):
        return type(first)(leafwise(function, [s[i] for s in structures]) for i in range(len(first)))
    return type(first)({k: leafwise(function, [s[k] for s in structures]) for k in first})


def expect_mismatch(call, *fragments):
    try:
        call()
    except DistributedOperationException as error:
        message = str(error)
        for fragment in fragments:
            assert fragment in message, (fragment, message)
        return message
    raise AssertionError(f"{call} did not raise DistributedOperationException")


def check_gather(n, rank):
    same(gather(make(rank)), torch.cat([make(r) for r in range(n)]))
    same(gather(torch.tensor(float(rank))), torch.tensor([float(r) for r in range(n)]))  # 0-d -> 1-d
    same(gather(nested(rank)), leafwise(torch.cat, [nested(r) for r in range(n)]))
    same(gather(make(rank, (3, 2)).t()), torch.cat([make(r, (3, 2)).t() for r in range(n)]))  # non-contiguous
    same(gather(torch.zeros(0, 3)), torch.zeros(0, 3))
    interleaved = [make(rank, (1,)), make(rank, (2,), torch.int64), make(rank, (3,)), make(rank, (), torch.int64)]
    same(gather(interleaved), leafwise(torch.cat, [[make(r, (1,)), make(r, (2,), torch.int64), make(r, (3,)),
                                                    make(r, (1,), torch.int64)] for r in range(n)]))
    loss = (make(rank, (4,)).requires_grad_() * 2).sum()
    same(gather(loss.detach()), torch.stack([(make(r, (4,)) * 2).sum() for r in range(n)]))
    assert gather(loss).shape == (n,)
    try:
        gather([make(rank), "text"])
    except TypeError as error:
        assert "gather_object" in str(error)
    else:
        raise AssertionError("gather of a str did not raise TypeError")


def check_pad(n, rank):
    mine = make(rank, (rank + 1, 2))
    for pad_first in (False, True):
        padded = pad_across_processes(mine, pad_index=-1, pad_first=pad_first)
        filler = torch.full((n - 1 - rank, 2), -1.0)
        same(padded, torch.cat([filler, mine] if pad_first else [mine, filler]))
        rows = [torch.cat([torch.full((n - 1 - r, 2), -1.0), make(r, (r + 1, 2))] if pad_first else
                          [make(r, (r + 1, 2)), torch.full((n - 1 - r, 2), -1.0)]) for r in range(n)]
        same(gather(padded), torch.cat(rows))
    # dim=1 and negative dims, nested containers, 0-d and dim >= ndim unchanged
    wide = make(rank, (2, rank + 2), torch.int64)
    data = {"w": wide, "s": torch.tensor(rank), "v": make(rank, (3,)), "p": Pair(x=wide, y=[wide.t()])}
    out = pad_across_processes(data, dim=1, pad_index=7)
    expected_wide = torch.cat([wide, torch.full((2, n - 1 - rank), 7, dtype=torch.int64)], dim=1)
    same(out["w"], expected_wide)
    same(out["p"].x, expected_wide)
    assert out["s"] is data["s"] and out["v"] is data["v"]
    same(out["p"].y[0], wide.t())  # its dim 1 is 2 everywhere already
    same(pad_across_processes(wide, dim=-1), torch.cat([wide, torch.zeros(2, n - 1 - rank, dtype=torch.int64)], 1))
    # more tensors than fit in the size header: the second exchange
    many = [make(rank, (i + rank, 1)) for i in range(20)]
    out = pad_across_processes(many)
    for i, tensor in enumerate(out):
        assert tensor.shape == (i + n - 1, 1), (i, tensor.shape)
        same(tensor[: i + rank], many[i])
    # a tensor whose number of dimensions differs between processes: an error on every rank, always on
    ragged = torch.zeros(*([2] * (rank + 1)))
    expect_mismatch(lambda: pad_across_processes({"t": ragged}), "pad_across_processes",
                    *[f"process {r}: {{'t': float32{[2] * (r + 1)}}}" for r in range(n)])
    # a non-tensor leaf on every process: TypeError everywhere, after the structure check
    try:
        pad_across_processes([mine, "text"])
    except TypeError:
        pass
    else:
        raise AssertionError("pad_across_processes of a str did not raise TypeError")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jagged = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
        assert pad_across_processes([jagged, mine])[0] is jagged
    assert any("nested" in str(w.message) for w in caught)


def check_reduce(n, rank):
    contributions = [make(r) for r in range(n)]
    total = sum(contributions[1:], contributions[0].clone())
    mine = make(rank)
    before = mine.clone()
    same(reduce(mine, "sum"), total)
    same(reduce(mine, "mean"), total / n)
    same(reduce(mine), total / n)  # default is mean
    same(reduce(mine, "max"), torch.stack(contributions).amax(0))
    same(reduce(mine, "min"), torch.stack(contributions).amin(0))
    same(reduce(mine, "none"), mine)
    same(reduce(mine, "sum", scale=0.5), total * 0.5)
    assert torch.equal(mine, before), "reduce modified the caller's tensor"
    ints = make(rank, (3,), torch.int64)
    same(reduce(ints, "sum"), sum(make(r, (3,), torch.int64) for r in range(n)))
    same(reduce(ints, "mean"), sum(make(r, (3,), torch.float64) for r in range(n)).float() / n)
    flags = torch.tensor([True, rank == 0, False])
    same(reduce(flags, "sum"), torch.tensor([n, 1, 0]))
    same(reduce(flags, "max"), torch.tensor([True, True, False]))
    same(reduce(flags, "min"), torch.tensor([True, n == 1, False]))
    same(reduce(flags, "mean"), torch.tensor([1.0, 1 / n, 0.0]))
    same(reduce(make(rank, (4,), torch.bfloat16), "sum"),
         sum(make(r, (4,), torch.float64) for r in range(n)).to(torch.bfloat16))
    same(reduce(torch.tensor(float(rank)), "sum"), torch.tensor(float(sum(range(n)))))
    data = nested(rank)
    data.pop("e")
    expected = leafwise(lambda leaves: sum(leaves[1:], leaves[0].clone()), [nested(r) for r in range(n)])
    expected.pop("e")
    same(reduce(data, "sum"), expected)
    loss = make(rank, (2,)).requires_grad_() * 3
    same(reduce(loss, "mean"), sum(make(r, (2,)) * 3 for r in range(n)) / n)
    try:
        reduce(mine, "avg")
    except ValueError as error:
        assert "'avg'" in str(error)
    else:
        raise AssertionError("unknown reduction accepted")


def check_broadcast(n, rank):
    for source in (0, n - 1):
        data = nested(rank)
        result = broadcast(data, from_process=source)
        assert result is data
        same(data, nested(source))
        scalar = torch.tensor(float(rank))
        broadcast(scalar, from_process=source)
        same(scalar, torch.tensor(float(source)))
        base = make(rank, (3, 2))
        view = base.t()  # non-contiguous: written through to `base`
        broadcast(view, from_process=source)
        same(base, make(source, (3, 2)))
        param = torch.nn.Parameter(make(rank, (2,)))
        broadcast([param, make(rank, (1,))], from_process=source)
        same(param.data, make(source, (2,)))
        objects = [f"from {rank}", {"rank": rank}] if rank == source else [None, None]
        assert broadcast_object_list(objects, from_process=source) is objects
        assert objects == [f"from {source}", {"rank": source}], objects
    for bad in (n, -1):
        try:
            broadcast(make(rank), from_process=bad)
        except ValueError as error:
            assert f"[0, {n - 1}]" in str(error)
        else:
            raise AssertionError("out-of-range from_process accepted")


def check_gather_object(n, rank):
    assert gather_object([rank, f"r{rank}"]) == [x for r in range(n) for x in (r, f"r{r}")]
    assert gather_object({"rank": rank}) == [{"rank": r} for r in range(n)]
    assert gather_object("ab") == ["ab"] * n
    assert gather_object([]) == []


def check_mismatches_in_debug_mode(n, rank, state):
    state.debug = True  # what HASTEN_DEBUG_MODE=1 sets when the state is created
    try:
        same(gather(make(rank)), torch.cat([make(r) for r in range(n)]))  # matching inputs pass the check
        same(reduce(make(rank), "sum"), sum(make(r) for r in range(n)))
        expect_mismatch(lambda: gather(make(rank, (3, 2 + rank))), "`gather`", "pad_across_processes",
                        *[f"process {r}: float32[3, {2 + r}]" for r in range(n)])  # only dim 0 may differ
        dtypes = [torch.float32, torch.float64, torch.int32, torch.int64]
        expect_mismatch(lambda: reduce({"x": make(rank, (2,), dtypes[rank % 4])}), "`reduce`",
                        *[f"process {r}: {{'x': {str(dtypes[r % 4])[6:]}[2]}}" for r in range(n)])
        expect_mismatch(lambda: broadcast([make(rank, (rank + 1,))], from_process=n - 1), "`broadcast`",
                        *[f"process {r}: [float32[{r + 1}]]" for r in range(n)])
        keys = {"a" if rank == 0 else "b": make(rank)}
        expect_mismatch(lambda: gather(keys), "process 0: {'a': float32[2, 3]}", "process 1: {'b': float32[2, 3]}")
        odd = make(rank) if rank else [make(rank)]
        expect_mismatch(lambda: reduce(odd), "process 0: [float32[2, 3]]", "process 1: float32[2, 3]")
        expect_mismatch(lambda: broadcast_object_list([None] * (rank + 1)), "broadcast_object_list",
                        "process 0: list of 1 objects", "process 1: list of 2 objects")
        expect_mismatch(lambda: gather([make(rank), "text" if rank == 1 else make(rank)]),
                        "process 1: [float32[2, 3], <str>]")
    finally:
        state.debug = False
    # the process group is still healthy after all those errors
    same(gather(make(rank)), torch.cat([make(r) for r in range(n)]))


def main():
    state = PartialState()
    n, rank = state.num_processes, state.process_index
    assert n >= 2 and state.use_distributed, f"test_ops needs 2 processes or more, not {state}"
    assert state.debug is is_debug_mode()
    for debug in (False, True):  # the fast path, then the same inputs through the mismatch check
        state.debug = debug
        check_gather(n, rank)
        check_pad(n, rank)
        check_reduce(n, rank)
        check_broadcast(n, rank)
        check_gather_object(n, rank)
    check_mismatches_in_debug_mode(n, rank, state)
    state.wait_for_everyone()
    if state.is_main_process:
        print(f"test_ops OK on {n} processes", flush=True)
    state.destroy_process_group()


if __name__ == "__main__":
    main()
