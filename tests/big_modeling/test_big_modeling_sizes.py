"""Sizes and memory budgets, with expectations computed by hand from shapes and dtypes."""
from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch.nn as nn

import hasten.utils as hu
from hasten.big_modeling import (compute_module_sizes, convert_file_size_to_int, dtype_byte_size,
                                 get_balanced_memory, get_max_layer_size, get_max_memory)


def _model():
    with torch.device("meta"):
        model = nn.Sequential(OrderedDict([
            ("embed", nn.Embedding(10, 4)),                         # 40 floats
            ("block", nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4))),  # 40 + 36 floats
            ("head", nn.Linear(4, 10, bias=False)),                  # 40 floats
        ]))
        model.block.register_buffer("ids", torch.zeros(3, dtype=torch.int64))  # 24 bytes
        model.block.register_buffer("flags", torch.zeros(16, dtype=torch.bool))  # 16 bits
    return model


def test_sizes_of_every_module_and_tensor():
    sizes = compute_module_sizes(_model())
    assert sizes["embed"] == sizes["embed.weight"] == 160
    assert sizes["block.0"] == 40 * 4 and sizes["block.1"] == 36 * 4
    assert sizes["block.ids"] == 24 and sizes["block.flags"] == 2  # bools are planned as packed bits
    assert sizes["block"] == 160 + 144 + 24 + 2
    assert sizes[""] == 160 + 330 + 160


def test_sizes_with_a_load_dtype_shrink_floats_only():
    sizes = compute_module_sizes(_model(), dtype=torch.float16)
    assert sizes["embed"] == 80
    assert sizes["block.ids"] == 24  # integers keep their dtype
    sizes = compute_module_sizes(_model(), dtype="float64")
    assert sizes["embed"] == 160  # a wider load dtype never makes float32 weights bigger
    sizes = compute_module_sizes(_model(), dtype=torch.float16, special_dtypes={"head.weight": "float32"})
    assert sizes["head"] == 160 and sizes["embed"] == 80


def test_tied_weights_are_counted_once():
    model = _model()
    model.head = nn.Linear(4, 10, bias=False, device="meta")
    model.head.weight = model.embed.weight
    sizes = compute_module_sizes(model)
    assert sizes[""] == 160 + 330
    assert sizes["head"] == 0


def test_buffers_only():
    sizes = compute_module_sizes(_model(), buffers_only=True)
    assert sizes[""] == 26 and "embed" not in sizes


def test_max_layer_size_respects_no_split_classes():
    model = _model()
    top = list(model.named_children())
    sizes = compute_module_sizes(model)
    assert get_max_layer_size(top, sizes, []) == (160, ["embed", "block.0", "head"])
    assert get_max_layer_size(top, sizes, ["Sequential"]) == (sizes["block"], ["block"])


def test_convert_file_size_to_int():
    assert convert_file_size_to_int(123) == 123
    assert convert_file_size_to_int("10GiB") == 10 * 2**30
    assert convert_file_size_to_int("200KB") == 200_000
    assert convert_file_size_to_int("1.5MiB") == 3 * 2**19
    assert convert_file_size_to_int("8Mb") == 10**6  # a lowercase b means bits
    assert convert_file_size_to_int("2TB") == 2 * 10**12
    for bad in ["ten GB", "10", "5XB", "-1GB", -3, True, None]:
        with pytest.raises(ValueError):
            convert_file_size_to_int(bad)


def test_dtype_byte_size():
    assert dtype_byte_size(torch.float32) == 4
    assert dtype_byte_size(torch.bfloat16) == 2
    assert dtype_byte_size(torch.bool) == 1 / 8
    assert dtype_byte_size(torch.float8_e5m2) == 1
    assert dtype_byte_size("float16") == 2
    with pytest.raises(ValueError):
        dtype_byte_size("not_a_dtype")


def test_get_max_memory_converts_orders_and_never_modifies_its_argument():
    given = {"cpu": "1GB", 1: "2GiB", "disk": 5, 0: 100, "cuda:3": "1KB"}
    snapshot = dict(given)
    budget = get_max_memory(given)
    assert given == snapshot
    assert list(budget) == [0, 1, 3, "cpu", "disk"]
    assert budget == {0: 100, 1: 2 * 2**30, 3: 1000, "cpu": 10**9, "disk": 5}


def test_get_max_memory_defaults_to_free_memory():
    budget = get_max_memory()
    assert budget["cpu"] > 0
    if not torch.cuda.is_available():
        assert list(budget) == ["cpu"]


@pytest.mark.parametrize("bad, message", [
    ({"gpu0": 10}, "not a device"),
    ({0: "lots"}, "Cannot read 'lots'"),
    ({"cpu": -5}, "not a size"),
    ({0: 1, "cuda:0": 2}, "twice"),
    ([("cpu", 1)], "must be a dict"),
])
def test_get_max_memory_rejects_bad_budgets(bad, message):
    with pytest.raises(ValueError, match=message):
        get_max_memory(bad)


def test_balanced_memory_spreads_over_gpus():
    model = _model()
    total = compute_module_sizes(model)[""]  # 650
    budget = get_balanced_memory(model, max_memory={0: 10_000, 1: 10_000, "cpu": 10_000})
    # per GPU: 650 // 2 = 325, plus a margin of 1.25 x the mean leaf-module size ((160+160+144+160)/4 = 156)
    assert budget[0] == 325 + int(1.25 * 156)
    assert budget[1] == 10_000 and budget["cpu"] == 10_000  # the last GPU keeps its budget
    low = get_balanced_memory(model, max_memory={0: 10_000, 1: 10_000, 2: 10_000}, low_zero=True)
    assert low[0] == max(0, total - low[1] - low[2]) == 0
    # one GPU, or none: nothing to balance
    assert get_balanced_memory(model, max_memory={0: 500, "cpu": 9}) == {0: 500, "cpu": 9}
    assert get_balanced_memory(model, max_memory={"cpu": 9, "disk": 99}) == {"cpu": 9, "disk": 99}
    # a disk budget next to GPUs is fine (the reference raises on the "disk" key)
    with_disk = get_balanced_memory(model, max_memory={0: 10_000, 1: 10_000, "disk": 10**9})
    assert with_disk == {0: 520, 1: 10_000, "disk": 10**9}


def test_balanced_memory_margin_uses_no_split_blocks():
    model = _model()
    budget = get_balanced_memory(model, max_memory={0: 10_000, 1: 10_000}, no_split_module_classes=["Sequential"])
    # the margin is 1.25 x the first Sequential met in model order below the root: `block` (330 bytes)
    assert budget[0] == 650 // 2 + int(1.25 * 330)


def test_names_are_exported_where_accelerate_users_look():
    assert hu.compute_module_sizes is compute_module_sizes
    assert hu.get_balanced_memory is get_balanced_memory
    import hasten.big_modeling.sizes as sizes_module

    assert sizes_module.get_max_memory is get_max_memory


def test_custom_dtypes_have_their_packed_sizes_in_planning():
    from hasten.big_modeling import infer_auto_device_map
    from hasten.utils import CustomDtype, dtype_byte_size

    assert (dtype_byte_size(CustomDtype.INT4), dtype_byte_size(CustomDtype.INT2), dtype_byte_size(CustomDtype.FP8)) \
        == (0.5, 0.25, 1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False))
    special = {"0.weight": CustomDtype.INT4, "1.weight": CustomDtype.INT4}
    # 2 x 4096 int4 weights = 4096 bytes: both fit in 4100 bytes of "cpu" memory, as float32 they would not
    assert set(infer_auto_device_map(model, max_memory={"cpu": 4100}, special_dtypes=special).values()) == {"cpu"}
