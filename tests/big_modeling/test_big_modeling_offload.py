"""The disk-offload format: raw tensor files plus index.json, readable by both hasten and the reference."""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

from hasten.big_modeling import (OffloadedWeightsLoader, PrefixedDataset, extract_submodules_state_dict,
                                 load_offloaded_weight, load_offloaded_weights, offload_state_dict, offload_weight)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8, torch.uint8, torch.bool,
          torch.float8_e4m3fn]


def _sample(dtype, shape=(3, 5)):
    values = torch.randn(shape) * 4
    return values > 0 if dtype == torch.bool else values.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_keeps_dtype_shape_and_values(tmp_path, dtype):
    for shape in [(3, 5), (), (0, 4), (2, 1, 3)]:
        tensor = _sample(dtype, shape)
        index = offload_weight(tensor, "w", tmp_path, index={})
        back = load_offloaded_weight(tmp_path / "w.dat", index["w"])
        assert back.dtype == dtype and back.shape == tensor.shape
        assert torch.equal(back.view(torch.uint8) if dtype.itemsize == 1 and dtype.is_floating_point else back,
                           tensor.view(torch.uint8) if dtype.itemsize == 1 and dtype.is_floating_point else tensor)


def test_non_contiguous_and_strided_tensors(tmp_path):
    tensor = torch.arange(12.0).reshape(3, 4).t()
    index = offload_weight(tensor, "t", tmp_path, index={})
    assert torch.equal(load_offloaded_weight(tmp_path / "t.dat", index["t"]), tensor)


def test_format_is_interchangeable_with_the_reference(tmp_path):
    reference = pytest.importorskip("accelerate.utils.offload")
    tensors = {f"x{i}": _sample(dtype) for i, dtype in enumerate([torch.float32, torch.bfloat16, torch.int64, torch.bool])}
    tensors["scalar"] = torch.tensor(3.5)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    offload_state_dict(ours, tensors)
    reference.offload_state_dict(str(theirs), tensors)
    assert json.loads((ours / "index.json").read_text()) == json.loads((theirs / "index.json").read_text())
    for name, tensor in tensors.items():
        assert (ours / f"{name}.dat").read_bytes() == (theirs / f"{name}.dat").read_bytes()
        info = json.loads((theirs / "index.json").read_text())[name]
        assert torch.equal(load_offloaded_weight(theirs / f"{name}.dat", info), tensor)
        assert torch.equal(reference.load_offloaded_weight(str(ours / f"{name}.dat"), info), tensor)


def test_offload_state_dict_refuses_meta_tensors(tmp_path):
    with pytest.raises(ValueError, match="meta device"):
        offload_state_dict(tmp_path, {"w": torch.empty(2, device="meta")})


def test_load_offloaded_weights_into_an_empty_model(tmp_path):
    source = nn.Linear(3, 2)
    offload_state_dict(tmp_path, source.state_dict())
    with torch.device("meta"):
        target = nn.Linear(3, 2)
    index = json.loads((tmp_path / "index.json").read_text())
    load_offloaded_weights(target, index, tmp_path)
    assert torch.equal(target.weight, source.weight) and target.weight.device.type == "cpu"
    load_offloaded_weights(target, {}, tmp_path)  # nothing to do


def test_weights_loader_reads_memory_then_disk_then_safetensors(tmp_path):
    offload_state_dict(tmp_path / "folder", {"a": torch.ones(2), "b": torch.zeros(3)})
    save_file({"stored": torch.full((2,), 7.0)}, tmp_path / "ckpt.safetensors")
    index = json.loads((tmp_path / "folder" / "index.json").read_text())
    index["c"] = {"safetensors_file": str(tmp_path / "ckpt.safetensors"), "weight_name": "stored", "dtype": "float16"}
    loader = OffloadedWeightsLoader(state_dict={"a": torch.full((2,), 5.0)}, save_folder=tmp_path / "folder", index=index)
    assert loader["a"].tolist() == [5.0, 5.0]  # memory first
    assert loader["b"].tolist() == [0.0, 0.0, 0.0]
    assert loader["c"].dtype == torch.float16 and loader["c"].tolist() == [7.0, 7.0]
    assert list(loader) == ["a", "b", "c"] and len(loader) == 3 and "c" in loader and "d" not in loader
    with pytest.raises(KeyError):
        loader["d"]


def test_weights_loader_needs_a_source(tmp_path):
    with pytest.raises(ValueError, match="needs a state_dict"):
        OffloadedWeightsLoader()
    with pytest.raises(FileNotFoundError, match="index.json"):
        OffloadedWeightsLoader(save_folder=tmp_path)


def test_prefixed_view_and_submodule_extraction():
    data = {"h.1.w": 1, "h.10.w": 2, "h.1.b": 3, "x": 4}
    view = PrefixedDataset(data, "h.1.")
    assert view["w"] == 1 and sorted(view) == ["b", "w"] and len(view) == 2 and "b" in view and "z" not in view
    assert extract_submodules_state_dict(data, ["h.1"]) == {"h.1.w": 1, "h.1.b": 3}
    assert extract_submodules_state_dict(data, ["x", "h.10"]) == {"h.10.w": 2, "x": 4}


def test_index_is_merged_and_written_atomically(tmp_path):
    offload_state_dict(tmp_path, {"a": torch.ones(1)})
    offload_state_dict(tmp_path, {"b": torch.ones(2)})
    assert set(json.loads((tmp_path / "index.json").read_text())) == {"a", "b"}
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path))


def test_truncated_file_is_reported(tmp_path):
    index = offload_weight(torch.ones(100), "w", tmp_path, index={})
    (tmp_path / "w.dat").write_bytes(b"\0" * 10)
    with pytest.raises(OSError, match="shorter"):
        load_offloaded_weight(tmp_path / "w.dat", index["w"])
