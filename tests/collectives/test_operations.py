"""hasten.utils.operations in one process: nested structures, local helpers and the one-process collectives.

Expected values come from plain torch or, in the differential tests, from Accelerate's own functions.
"""
from __future__ import annotations

import collections
import pickle
from collections import OrderedDict, UserDict, defaultdict

import pytest
import torch

from hasten.state import PartialState
from hasten.collectives import operations as ops

from hasten.test_utils.scripts.test_ops import Batch, Pair  # a Mapping that is not a dict, and a namedtuple


class MovableBatch(UserDict):
    """Like transformers' BatchEncoding: a UserDict with its own ``.to``."""

    moved_with_own_to = False

    def to(self, device, non_blocking=False):
        moved = MovableBatch({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.items()})
        moved.moved_with_own_to = True
        return moved


class Movable:
    """An object with a ``.to`` that takes non_blocking."""

    def __init__(self):
        self.calls = []

    def to(self, device, non_blocking=False):
        self.calls.append((device, non_blocking))
        return self


class OldMovable:
    """An object whose ``.to`` does not take non_blocking."""

    def __init__(self):
        self.device = None

    def to(self, device):
        self.device = device
        return self


def sample():
    """One of every container the operations must keep."""
    return {
        "list": [torch.ones(2), torch.zeros(2, dtype=torch.int64)],
        "tuple": (torch.ones(1, dtype=torch.bfloat16),),
        "pair": Pair(x=torch.ones(3), y=torch.tensor(2.0)),
        "ordered": OrderedDict(a=torch.ones(1, 2)),
        "mapping": Batch({"m": torch.ones(4)}),
        "userdict": UserDict({"u": torch.ones(2)}),
        "default": defaultdict(list, {"d": torch.ones(2)}),
    }


def assert_same_layout(actual, expected):
    """Same container types and keys all the way down; leaves compared with torch.equal (tensors) or ==."""
    assert type(actual) is type(expected), (type(actual), type(expected))
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape and actual.device == expected.device
        if expected.device.type != "meta":
            assert torch.equal(actual, expected)
    elif isinstance(expected, collections.abc.Mapping):
        assert list(actual.keys()) == list(expected.keys())
        for key in expected:
            assert_same_layout(actual[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same_layout(a, e)
    else:
        assert actual == expected


# --------------------------------------------------------------------------------------------- structure
def test_recursively_apply_keeps_every_container_type():
    data = sample()
    doubled = ops.recursively_apply(lambda t, k, bias=0: t * k + bias, data, 2, bias=1)
    expected = sample()
    for key in ("list",):
        expected[key] = [t * 2 + 1 for t in expected[key]]
    expected["tuple"] = (expected["tuple"][0] * 2 + 1,)
    expected["pair"] = Pair(x=expected["pair"].x * 2 + 1, y=expected["pair"].y * 2 + 1)
    expected["ordered"] = OrderedDict(a=expected["ordered"]["a"] * 2 + 1)
    expected["mapping"] = Batch({"m": expected["mapping"]["m"] * 2 + 1})
    expected["userdict"] = UserDict({"u": expected["userdict"]["u"] * 2 + 1})
    expected["default"] = defaultdict(list, {"d": expected["default"]["d"] * 2 + 1})
    assert_same_layout(doubled, expected)
    assert doubled["default"].default_factory is list  # defaultdict keeps its factory


def test_recursively_apply_other_leaves():
    data = [torch.ones(1), "text", 3]
    out = ops.recursively_apply(lambda t: t + 1, data)
    assert out[1:] == ["text", 3] and torch.equal(out[0], torch.full((1,), 2.0))
    with pytest.raises(TypeError, match=r"^Unsupported types \(<class 'str'>\) passed to `<lambda>`. Only nested "
                                        r"list/tuple/dicts of objects that are valid for `is_torch_tensor`"):
        ops.recursively_apply(lambda t: t, data, error_on_other_type=True)  # the reference's words
    only_ints = ops.recursively_apply(lambda i: i * 10, {"a": [1, "x"]}, test_type=lambda o: isinstance(o, int))
    assert only_ints == {"a": [10, "x"]}


def test_mapping_that_cannot_be_rebuilt_gets_a_clear_error():
    class Stubborn(collections.abc.Mapping):
        def __init__(self, data, extra):
            self._data = dict(data)

        def __getitem__(self, key):
            return self._data[key]

        def __iter__(self):
            return iter(self._data)

        def __len__(self):
            return len(self._data)

    with pytest.raises(TypeError, match="Cannot rebuild a Stubborn"):
        ops.recursively_apply(lambda t: t, Stubborn({"a": torch.ones(1)}, extra=1))


def test_honor_type_and_is_namedtuple():
    assert ops.honor_type([0], (i for i in range(3))) == [0, 1, 2]
    assert ops.honor_type((0,), (i for i in range(2))) == (0, 1)
    pair = ops.honor_type(Pair(0, 0), (i for i in (5, 6)))
    assert isinstance(pair, Pair) and pair == Pair(5, 6)
    assert ops.is_namedtuple(Pair(1, 2)) and not ops.is_namedtuple((1, 2))
    assert ops.is_torch_tensor(torch.ones(1)) and ops.is_torch_tensor(torch.nn.Parameter(torch.ones(1)))
    assert not ops.is_torch_tensor([1.0])


def test_data_structure_round_trip():
    data = {"x": torch.ones(2, 3, dtype=torch.bfloat16), "y": [torch.zeros(4, dtype=torch.int64)], "s": "keep"}
    structure = ops.get_data_structure(data)
    assert structure["x"] == ops.TensorInformation(shape=torch.Size([2, 3]), dtype=torch.bfloat16)
    assert pickle.loads(pickle.dumps(structure)) == structure  # it travels through broadcast_object_list
    rebuilt = ops.initialize_tensors(structure)
    assert rebuilt["x"].shape == (2, 3) and rebuilt["x"].dtype == torch.bfloat16
    assert rebuilt["y"][0].shape == (4,) and rebuilt["y"][0].dtype == torch.int64 and rebuilt["s"] == "keep"
    assert ops.initialize_tensors(structure, device="meta")["x"].device.type == "meta"
    assert ops.get_shape(data) == {"x": [2, 3], "y": [[4]], "s": "keep"}


def test_find_batch_size():
    assert ops.find_batch_size({"a": [torch.ones(5, 2), torch.ones(3)]}) == 5
    assert ops.find_batch_size(Pair(x=torch.ones(7), y=None)) == 7
    assert ops.find_batch_size(Batch({"m": torch.ones(4, 1)})) == 4
    with pytest.raises(ValueError, match="empty"):
        ops.find_batch_size([])
    with pytest.raises(TypeError, match="str"):
        ops.find_batch_size(["x"])
    with pytest.raises(ValueError, match="0-d"):
        ops.find_batch_size(torch.tensor(1.0))
    assert ops.ignorant_find_batch_size({}) is None and ops.ignorant_find_batch_size(torch.ones(2)) == 2


def test_find_device():
    meta = torch.ones(1, device="meta")
    assert ops.find_device({"a": "text", "b": [3, (meta,)]}) == torch.device("meta")
    assert ops.find_device(Batch({"m": torch.ones(1)})) == torch.device("cpu")
    assert ops.find_device(["no", {"tensors": 1}]) is None


# --------------------------------------------------------------------------------------------- local helpers
def test_send_to_device_moves_every_tensor_and_keeps_types():
    moved = ops.send_to_device(sample(), "meta")
    expected = ops.recursively_apply(lambda t: torch.empty_like(t, device="meta"), sample())
    assert_same_layout(moved, expected)


def test_send_to_device_skip_keys():
    data = {"a": torch.ones(1), "b": {"a": torch.ones(1), "c": torch.ones(1)}, "c": [torch.ones(1)]}
    moved = ops.send_to_device(data, "meta", skip_keys="a")
    assert moved["a"].device.type == "cpu" and moved["b"]["a"].device.type == "cpu"
    assert moved["b"]["c"].device.type == "meta" and moved["c"][0].device.type == "meta"
    moved = ops.send_to_device(data, "meta", skip_keys=["a", "c"])
    assert moved["c"][0].device.type == "cpu" and moved["b"]["c"].device.type == "cpu"


def test_send_to_device_objects_with_to():
    movable, old = Movable(), OldMovable()
    out = ops.send_to_device({"m": movable, "o": [old], "n": 3, "s": "x"}, "meta", non_blocking=True)
    assert out["m"] is movable and movable.calls == [("meta", True)]
    assert out["o"][0] is old and old.device == "meta"  # fell back to .to(device)
    assert out["n"] == 3 and out["s"] == "x"
    batch = MovableBatch({"ids": torch.ones(2), "mask": torch.ones(2)})
    own = ops.send_to_device(batch, "meta")
    assert own.moved_with_own_to and own["ids"].device.type == "meta"
    skipped = ops.send_to_device(batch, "meta", skip_keys="mask")  # skip_keys honoured even with its own .to
    assert isinstance(skipped, MovableBatch) and not skipped.moved_with_own_to
    assert skipped["ids"].device.type == "meta" and skipped["mask"].device.type == "cpu"


def test_slice_tensors():
    data = {"a": torch.arange(6), "b": [torch.arange(12).reshape(6, 2)], "s": "keep"}
    out = ops.slice_tensors(data, slice(2, 4), process_index=1, num_processes=3)
    assert torch.equal(out["a"], torch.tensor([2, 3])) and torch.equal(out["b"][0], torch.tensor([[4, 5], [6, 7]]))
    assert out["s"] == "keep"


def test_concatenate():
    batches = [{"x": torch.ones(2, 3), "y": Pair(torch.zeros(2), [torch.ones(1)])},
               {"x": torch.zeros(1, 3), "y": Pair(torch.ones(3), [torch.zeros(1)])}]
    out = ops.concatenate(batches)
    assert torch.equal(out["x"], torch.cat([torch.ones(2, 3), torch.zeros(1, 3)]))
    assert isinstance(out["y"], Pair) and torch.equal(out["y"].x, torch.tensor([0.0, 0, 1, 1, 1]))
    assert torch.equal(out["y"].y[0], torch.tensor([1.0, 0.0]))
    assert torch.equal(ops.concatenate([torch.ones(2, 1), torch.zeros(2, 1)], dim=1), torch.tensor([[1.0, 0], [1, 0]]))
    assert ops.concatenate(["only"]) == "only"
    with pytest.raises(TypeError, match="str"):
        ops.concatenate(["a", "b"])
    with pytest.raises(ValueError, match="non-empty"):
        ops.concatenate([])


def test_listify():
    data = {"f": torch.tensor([1.5, 2.0], dtype=torch.bfloat16), "i": torch.tensor([[1, 2]]), "s": torch.tensor(3.0),
            "g": torch.ones(1, requires_grad=True), "keep": "x"}
    assert ops.listify(data) == {"f": [1.5, 2.0], "i": [[1, 2]], "s": 3.0, "g": [1.0], "keep": "x"}


def test_convert_to_fp32():
    data = {"h": torch.ones(2, dtype=torch.float16), "b": [torch.ones(1, dtype=torch.bfloat16)],
            "d": torch.ones(1, dtype=torch.float64), "i": torch.ones(1, dtype=torch.int64)}
    out = ops.convert_to_fp32(data)
    assert out["h"].dtype == torch.float32 and out["b"][0].dtype == torch.float32
    assert out["d"] is data["d"] and out["i"] is data["i"]


def half_forward(x):
    """Module-level so the wrapper can be pickled."""
    return {"logits": x.to(torch.float16), "ids": x.long()}


def test_convert_outputs_to_fp32():
    wrapped = ops.convert_outputs_to_fp32(half_forward)
    out = wrapped(torch.ones(2))
    assert out["logits"].dtype == torch.float32 and out["ids"].dtype == torch.int64
    assert wrapped.__wrapped__ is half_forward and wrapped.__name__ == "half_forward"
    again = pickle.loads(pickle.dumps(wrapped))
    assert again(torch.ones(1))["logits"].dtype == torch.float32
    model = torch.nn.Linear(2, 2).to(torch.bfloat16)
    model.forward = ops.convert_outputs_to_fp32(model.forward)
    assert model(torch.ones(1, 2, dtype=torch.bfloat16)).dtype == torch.float32
    with pytest.raises(TypeError, match="callable"):
        ops.convert_outputs_to_fp32(3)


# --------------------------------------------------------------------------------------------- one process
def test_gather_in_one_process_is_the_identity():
    data = sample()
    out = ops.gather(data)
    assert out["list"][0] is data["list"][0] and out["ordered"]["a"] is data["ordered"]["a"]
    assert out["pair"].y.shape == (1,) and out["pair"].y.item() == 2.0  # 0-d -> 1-d, as across processes
    assert type(out["mapping"]) is Batch and type(out["pair"]) is Pair
    with pytest.raises(TypeError, match="gather_object"):
        ops.gather([torch.ones(1), "text"])


def test_reduce_in_one_process():
    x = torch.tensor([1.0, 2.0])
    for reduction in ("mean", "sum", "max", "min", "none"):
        out = ops.reduce(x, reduction)
        assert torch.equal(out, x) and out is not x
    out = ops.reduce(x, "sum")
    out += 1
    assert torch.equal(x, torch.tensor([1.0, 2.0]))  # the caller's tensor is never written
    assert torch.equal(ops.reduce(x, "sum", scale=3.0), torch.tensor([3.0, 6.0]))
    mean_of_ints = ops.reduce(torch.tensor([1, 2]), "mean")
    assert mean_of_ints.dtype == torch.get_default_dtype() and torch.equal(mean_of_ints, torch.tensor([1.0, 2.0]))
    assert ops.reduce(torch.tensor([1, 2]), "sum").dtype == torch.int64
    flags = torch.tensor([True, False])
    assert torch.equal(ops.reduce(flags, "sum"), torch.tensor([1, 0]))
    assert torch.equal(ops.reduce(flags, "max"), flags)
    assert torch.equal(ops.reduce(flags, "mean"), torch.tensor([1.0, 0]))
    nested = ops.reduce({"a": [torch.ones(2)], "p": Pair(torch.ones(1), torch.tensor(1))}, "sum")
    assert isinstance(nested["p"], Pair) and nested["p"].y.shape == ()
    assert not ops.reduce(torch.ones(1, requires_grad=True)).requires_grad
    with pytest.raises(ValueError, match="'avg'"):
        ops.reduce(x, "avg")


def test_pad_in_one_process():
    data = {"a": torch.ones(2, 3), "s": torch.tensor(1.0)}
    assert ops.pad_across_processes(data) is data
    with pytest.raises(TypeError, match="dim"):
        ops.pad_across_processes(data, dim="0")
    with pytest.raises(TypeError, match="str"):
        ops.pad_across_processes([torch.ones(1), "x"])
    jagged = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    with pytest.warns(ops.CannotPadNestedTensorWarning):
        assert ops.pad_across_processes(jagged) is jagged


def test_gather_object_in_one_process():
    assert ops.gather_object([1, "a"]) == [1, "a"]
    assert ops.gather_object((1, 2)) == [1, 2]
    assert ops.gather_object({"k": 1}) == [{"k": 1}]
    assert ops.gather_object("ab") == ["ab"]


def test_broadcast_in_one_process():
    data = [torch.ones(2)]
    assert ops.broadcast(data) is data and torch.equal(data[0], torch.ones(2))
    with pytest.raises(ValueError, match=r"from_process=1 .*\[0, 0\]"):
        ops.broadcast(data, from_process=1)
    objects = ["x", None]
    assert ops.broadcast_object_list(objects) is objects and objects == ["x", None]
    with pytest.raises(TypeError, match="list"):
        ops.broadcast_object_list(("x",))
    with pytest.raises(ValueError, match="from_process"):
        ops.broadcast_object_list(objects, from_process=-1)


def test_debug_switch_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("HASTEN_DEBUG_MODE", "1")
    assert PartialState().debug is True
    PartialState._reset_state()
    monkeypatch.delenv("HASTEN_DEBUG_MODE")
    assert PartialState().debug is False


def test_public_names_resolve_from_hasten_utils():
    import hasten.utils as utils

    for name in ("broadcast", "broadcast_object_list", "concatenate", "convert_to_fp32", "convert_outputs_to_fp32",
                 "gather", "gather_object", "listify", "pad_across_processes", "recursively_apply", "reduce",
                 "send_to_device", "slice_tensors", "find_batch_size", "is_torch_tensor", "honor_type",
                 "find_device", "DistributedOperationException"):
        assert getattr(utils, name) is getattr(ops, name)


# --------------------------------------------------------------------------------------------- vs Accelerate
@pytest.fixture
def reference():
    return pytest.importorskip("accelerate.utils.operations")


def tensors_only():
    return {"x": torch.arange(6.0).reshape(2, 3), "y": [torch.arange(4), (torch.ones(2, dtype=torch.bfloat16),)],
            "p": Pair(x=torch.ones(2, 2, dtype=torch.float16), y=torch.zeros(2, dtype=torch.int32)),
            "o": OrderedDict(z=torch.ones(2, 1))}


@pytest.mark.parametrize("name, call", [
    ("send_to_device", lambda f, d: f(d, "meta")),
    ("send_to_device", lambda f, d: f(d, "meta", skip_keys=["x", "z"])),
    ("slice_tensors", lambda f, d: f(d, slice(0, 1))),
    ("listify", lambda f, d: f(d)),
    ("convert_to_fp32", lambda f, d: f(d)),
    ("find_batch_size", lambda f, d: f(d)),
    ("find_device", lambda f, d: f(d)),
    ("get_shape", lambda f, d: f(d)),
    ("get_data_structure", lambda f, d: f(d)),
    ("concatenate", lambda f, d: f([d, d])),
    ("gather", lambda f, d: f(d)),
    ("pad_across_processes", lambda f, d: f(d, dim=1, pad_index=-1, pad_first=True)),
    ("reduce", lambda f, d: f(ops.recursively_apply(lambda t: t.float(), d), "sum")),
    ("reduce", lambda f, d: f(ops.recursively_apply(lambda t: t.float(), d), "mean")),
    ("reduce", lambda f, d: f(ops.recursively_apply(lambda t: t.float(), d), "max")),
    ("gather_object", lambda f, d: f([1, {"a": 2}])),
    ("broadcast_object_list", lambda f, d: f(["a", 1])),
])
def test_matches_accelerate_in_one_process(reference, name, call):
    ours = call(getattr(ops, name), tensors_only())
    theirs = call(getattr(reference, name), tensors_only())
    if name == "get_data_structure":
        ours = ops.recursively_apply(lambda i: (tuple(i.shape), i.dtype), ours, test_type=ops.is_tensor_information)
        theirs = ops.recursively_apply(lambda i: (tuple(i.shape), i.dtype), theirs,
                                       test_type=lambda o: type(o).__name__ == "TensorInformation")
    assert_same_layout(ours, theirs)


def test_initialize_tensors_matches_accelerate(reference):
    from accelerate.utils import TensorInformation as Reference

    ours = ops.initialize_tensors([ops.TensorInformation(torch.Size([2, 3]), torch.int8)])
    theirs = reference.initialize_tensors([Reference(torch.Size([2, 3]), torch.int8)])
    assert ours[0].shape == theirs[0].shape and ours[0].dtype == theirs[0].dtype
