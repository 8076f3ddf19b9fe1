"""Device-map planning and checking, on small models whose maps can be worked out by hand."""
from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch.nn as nn

from hasten.big_modeling import check_device_map, clean_device_map, compute_module_sizes, infer_auto_device_map


def _four_layers():
    with torch.device("meta"):
        return nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])  # 80 bytes each


def test_gpus_then_cpu_then_disk_keeping_room_for_the_largest_layer():
    # GPU 0 and the CPU are "main" devices: each keeps 80 bytes (the largest layer) free, so 200 bytes hold one layer
    device_map = infer_auto_device_map(_four_layers(), max_memory={0: 200, "cpu": 200})
    assert dict(device_map) == {"0": 0, "1": "cpu", "2": "disk", "3": "disk"}


def test_second_gpu_is_filled_without_reserve():
    device_map = infer_auto_device_map(_four_layers(), max_memory={0: 200, 1: 160, "cpu": 10_000})
    assert dict(device_map) == {"0": 0, "1": 1, "2": 1, "3": "cpu"}


def test_everything_on_one_device_collapses_to_the_root():
    assert dict(infer_auto_device_map(_four_layers(), max_memory={0: 10_000})) == {"": 0}
    unclean = infer_auto_device_map(_four_layers(), max_memory={0: 10_000}, clean_result=False)
    assert dict(unclean) == {"0": 0, "1": 0, "2": 0, "3": 0}


def test_load_dtype_changes_what_fits():
    assert dict(infer_auto_device_map(_four_layers(), max_memory={0: 200, "cpu": 10_000}))["3"] == "cpu"
    half = infer_auto_device_map(_four_layers(), max_memory={0: 200, "cpu": 10_000}, dtype=torch.float16)
    # 40 bytes per layer, 40 reserved: 160 bytes hold four layers
    assert dict(half) == {"": 0}


def test_no_split_blocks_move_whole():
    with torch.device("meta"):
        model = nn.Sequential(OrderedDict([("a", nn.Linear(4, 4)), ("block", nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))]))
    budget = {0: 230, "cpu": 10_000}
    split = infer_auto_device_map(model, max_memory=budget)
    whole = infer_auto_device_map(model, max_memory=budget, no_split_module_classes=["Sequential"])
    # split: layers are 80 bytes; `a` fits in 230 - 80, the block does not and its parts go to the cpu
    assert dict(split) == {"a": 0, "block": "cpu"}
    # whole: the largest layer is the 160-byte block, so GPU 0 keeps 160 free and even `a` does not fit
    assert dict(whole) == {"": "cpu"}


def test_fallback_allocation_finds_a_smaller_module_for_an_empty_device():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(3, 2), nn.Linear(4, 8))  # 160, 32 and 160 bytes
    budget = {0: 210, "cpu": 10_000}
    # GPU 0 keeps 160 bytes for the largest layer: the first layer does not fit in the 50 left, so by default
    # everything goes to the cpu; the fallback search finds the 32-byte layer for GPU 0 first
    assert dict(infer_auto_device_map(model, max_memory=budget)) == {"": "cpu"}
    assert dict(infer_auto_device_map(model, max_memory=budget, fallback_allocation=True)) == \
        {"0": "cpu", "1": 0, "2": "cpu"}


def test_tied_weights_land_together():
    with torch.device("meta"):
        model = nn.Sequential(OrderedDict([("embed", nn.Embedding(10, 4)), ("mid", nn.Linear(4, 8)),
                                           ("head", nn.Linear(4, 10, bias=False)), ("tail", nn.Linear(4, 4))]))
    model.head.weight = model.embed.weight
    device_map = infer_auto_device_map(model, max_memory={0: 330, "cpu": 10_000}, clean_result=False)
    # the head's weight is the embedding's: it goes where the embedding goes, before `mid` is considered
    assert dict(device_map) == {"embed": 0, "head": 0, "mid": "cpu", "tail": "cpu"}


def test_numeric_names_with_ties_do_not_confuse_the_planner():
    """Accelerate matches tied names by substring: module "1" claims "11.weight" and its planner crashes."""
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(4, 4, bias=False) for _ in range(12)])
    model[11].weight = model[0].weight
    device_map = infer_auto_device_map(model, max_memory={0: 200, "cpu": 200, "disk": 10_000}, clean_result=False)
    assert device_map["0"] == device_map["11"]
    check_device_map(model, device_map)
    accelerate_utils = pytest.importorskip("accelerate.utils")
    with pytest.raises(IndexError):
        accelerate_utils.infer_auto_device_map(model, max_memory={0: 200, "cpu": 200, "disk": 10_000})


def test_buffers_of_offloaded_modules_that_fit_no_gpu_are_reported():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(400))
    with pytest.warns(UserWarning, match="offload_buffers=True"):
        infer_auto_device_map(model, max_memory={0: 100, "cpu": 100_000})


def test_verbose_explains_each_decision(capsys):
    infer_auto_device_map(_four_layers(), max_memory={0: 200, "cpu": 200}, verbose=True)
    out = capsys.readouterr().out
    assert "Putting 0" in out and "on disk" in out


def test_planning_accepts_a_model_on_any_device_and_rejects_non_modules():
    model = nn.Sequential(nn.Linear(4, 4))
    assert dict(infer_auto_device_map(model, max_memory={"cpu": 10_000})) == {"0": "cpu"}  # one entry: nothing to merge
    with pytest.raises(TypeError, match="nn.Module"):
        infer_auto_device_map({"not": "a model"})
    with pytest.raises(ValueError, match="Cannot read"):
        infer_auto_device_map(model, max_memory={0: "plenty"})


def test_check_device_map():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    check_device_map(model, {"": "cpu"})
    check_device_map(model, {"0": 0, "1": "disk"})
    check_device_map(model, {"0.weight": "cpu", "0.bias": "cpu", "1": "cpu"})  # tensor-level keys are fine
    with pytest.raises(ValueError, match="1.running_mean"):
        check_device_map(model, {"0": "cpu", "1.weight": "cpu", "1.bias": "cpu"})
    with pytest.warns(UserWarning, match=r"device_map keys do not match any submodules.*\['2'\]"):
        check_device_map(model, {"": "cpu", "2": "cpu"})  # placed nothing: named, as in the reference
    with pytest.raises(ValueError, match="Unknown device 'gpu'"):
        check_device_map(model, {"0": "gpu", "1": "cpu"})
    with pytest.raises(ValueError, match="Unknown device -1"):
        check_device_map(model, {"": -1})
    check_device_map(model, {"0": "cuda:1", "1": torch.device("meta")})  # syntax only: devices need not exist here


def test_clean_device_map_merges_from_the_outside_in():
    device_map = OrderedDict([("a.x", 0), ("a.y.p", 0), ("a.y.q", 0), ("b.c", 1), ("b.d", "cpu"), ("b.e.f", "cpu"),
                              ("b.e.g", "cpu"), ("c", "disk")])
    cleaned = clean_device_map(device_map)
    assert cleaned is device_map
    assert list(cleaned.items()) == [("a", 0), ("b.c", 1), ("b.d", "cpu"), ("b.e", "cpu"), ("c", "disk")]
    assert dict(clean_device_map({"x.0": "cpu", "x.1": "cpu", "y": "cpu"})) == {"": "cpu"}
    assert dict(clean_device_map({"h.1": 0, "h.10": 0, "h.2": 1})) == {"h.1": 0, "h.10": 0, "h.2": 1}
    assert dict(clean_device_map({"a.b": 0, "c": 1})) == {"a.b": 0, "c": 1}  # one part alone is not merged


def test_sizes_are_what_planning_sees():
    model = _four_layers()
    assert compute_module_sizes(model)[""] == 320
