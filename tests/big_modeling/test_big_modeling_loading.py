"""Checkpoint loading: file layouts, device maps, dtypes, offloading, and errors raised before anything loads."""
from __future__ import annotations

import json
import logging
import os

import pytest
import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from big_modeling_models import TinyLM, trained_tiny_lm
from hasten.big_modeling import (find_tied_parameters, init_empty_weights, load_checkpoint_in_model, load_state_dict,
                                 set_module_tensor_to_device)


def _untied_state(model):
    """The state dict as a checkpoint stores it: tied copies once (the head shares the embedding)."""
    return {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"}


def _empty(**kwargs):
    with init_empty_weights():
        return TinyLM(**kwargs)


def _assert_same_weights(model, reference):
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name].to(tensor.dtype), tensor), name


@pytest.fixture
def reference():
    return trained_tiny_lm(seed=1)


@pytest.fixture
def safetensors_file(tmp_path, reference):
    path = tmp_path / "model.safetensors"
    save_file(_untied_state(reference), path, metadata={"format": "pt"})
    return path


def _sharded(tmp_path, reference, suffix=".safetensors"):
    state = _untied_state(reference)
    names = list(state)
    shards = {f"model-0000{i + 1}-of-00002{suffix}": names[i::2] for i in range(2)}
    weight_map = {}
    for shard, keys in shards.items():
        part = {k: state[k] for k in keys}
        if suffix == ".safetensors":
            save_file(part, tmp_path / shard, metadata={"format": "pt"})
        else:
            torch.save(part, tmp_path / shard)
        weight_map.update({k: shard for k in keys})
    index = tmp_path / f"model{suffix}.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


# ------------------------------------------------------------------ load_state_dict
def test_load_state_dict_matches_safetensors_own_reader(tmp_path):
    tensors = {"f32": torch.randn(3, 4), "bf16": torch.randn(5).bfloat16(), "f16": torch.randn(2, 2).half(),
               "i64": torch.arange(6).reshape(2, 3), "b": torch.tensor([True, False]), "scalar": torch.tensor(2.5),
               "empty": torch.zeros(0, 3), "f8": torch.randn(4).to(torch.float8_e5m2)}
    save_file(tensors, tmp_path / "x.safetensors")
    ours, theirs = load_state_dict(str(tmp_path / "x.safetensors")), load_file(tmp_path / "x.safetensors")
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype and ours[key].shape == theirs[key].shape
        assert torch.equal(ours[key].view(torch.uint8) if key == "f8" else ours[key],
                           theirs[key].view(torch.uint8) if key == "f8" else theirs[key])


def test_load_state_dict_sends_each_tensor_to_its_device(safetensors_file, reference):
    state = load_state_dict(safetensors_file, device_map={"embed": "meta", "blocks": "disk", "norm": "cpu"})
    assert state["embed.weight"].device.type == "meta"
    assert state["blocks.0.fc1.weight"].device.type == "cpu"  # disk tensors are read to the CPU
    assert torch.equal(state["norm.weight"], reference.norm.weight)


def test_load_state_dict_bin_and_bad_files(tmp_path, reference):
    torch.save(reference.state_dict(), tmp_path / "w.bin")
    state = load_state_dict(tmp_path / "w.bin")
    assert torch.equal(state["blocks.3.fc2.bias"], reference.blocks[3].fc2.bias)
    save_file({"a": torch.ones(1)}, tmp_path / "tf.safetensors", metadata={"format": "tf"})
    with pytest.raises(ValueError, match="PyTorch"):
        load_state_dict(tmp_path / "tf.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 20)
    with pytest.raises(ValueError, match="not a safetensors file"):
        load_state_dict(tmp_path / "junk.safetensors")
    with pytest.raises(FileNotFoundError):
        load_state_dict(tmp_path / "absent.safetensors")


def _rss_file() -> int:
    """Bytes of file-backed pages this process has resident (Linux)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssFile:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RssFile from /proc (Linux)")
def test_passed_on_tensors_leave_no_file_pages_behind_and_stay_readable(tmp_path):
    from hasten.big_modeling.checkpoint_files import SafetensorsFile

    tensors = {f"w{i}": torch.randn(1024, 1024) for i in range(8)}  # 32 MB
    save_file(tensors, tmp_path / "w.safetensors")
    reader = SafetensorsFile(str(tmp_path / "w.safetensors"))
    before = _rss_file()
    passed_on = {name: view for name, view in reader.tensors(mapped=lambda name: False)
                 if view.to(torch.bfloat16) is not None}  # the caller's copy, made before the next tensor
    assert _rss_file() - before < 8 << 20, "the passed-on tensors' file pages stayed in the process"
    for name, view in passed_on.items():  # released pages read the file again
        assert torch.equal(view, tensors[name]), name
    before = _rss_file()
    kept = dict(reader.tensors())
    assert all(float(view.sum()) == float(tensors[name].sum()) for name, view in kept.items())
    assert _rss_file() - before > 24 << 20, "kept views should be the file's own pages"


def test_truncated_and_unaligned_safetensors(tmp_path):
    import struct

    save_file({"a": torch.arange(1000.0)}, tmp_path / "t.safetensors")
    data = (tmp_path / "t.safetensors").read_bytes()
    (tmp_path / "t.safetensors").write_bytes(data[:-100])
    with pytest.raises(ValueError, match="truncated"):
        load_state_dict(tmp_path / "t.safetensors")
    header = json.dumps({"u": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                         "f": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}}).encode()
    header += b" " * (-len(header) % 8)  # a float32 tensor one byte past an 8-byte boundary
    (tmp_path / "u.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes([7])
                                             + struct.pack("<2f", 1.5, -2.0))
    state = load_state_dict(tmp_path / "u.safetensors")
    assert state["u"].tolist() == [7] and state["f"].tolist() == [1.5, -2.0]


# ------------------------------------------------------------------ layouts
@pytest.mark.parametrize("layout", ["file", "folder", "index", "folder_with_index", "bin_folder", "bin_index"])
def test_every_checkpoint_layout_loads(tmp_path, reference, layout):
    if layout == "file":
        save_file(_untied_state(reference), tmp_path / "weights.safetensors")
        checkpoint = tmp_path / "weights.safetensors"
    elif layout == "folder":
        save_file(_untied_state(reference), tmp_path / "model.safetensors")
        checkpoint = tmp_path
    elif layout == "index":
        checkpoint = _sharded(tmp_path, reference)
    elif layout == "folder_with_index":
        _sharded(tmp_path, reference)
        checkpoint = tmp_path
    elif layout == "bin_folder":
        torch.save(_untied_state(reference), tmp_path / "pytorch_model.bin")
        checkpoint = tmp_path
    else:
        checkpoint = _sharded(tmp_path, reference, suffix=".bin")
    for device_map in (None, {"": "cpu"}, {"embed": "cpu", "blocks": "cpu", "norm": "cpu", "head": "cpu"}):
        model = _empty()
        load_checkpoint_in_model(model, str(checkpoint), device_map=device_map)
        _assert_same_weights(model, reference)
        assert model.head.weight is model.embed.weight


def test_loading_into_a_real_model_copies_in_place(safetensors_file, reference):
    model = TinyLM()
    weight = model.blocks[0].fc1.weight
    load_checkpoint_in_model(model, safetensors_file)
    assert model.blocks[0].fc1.weight is weight  # same parameter object: optimizers keep working
    _assert_same_weights(model, reference)


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "nowhere", "does not exist"),
    (lambda d: d, "neither"),
])
def test_missing_checkpoints_are_reported(tmp_path, make, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_checkpoint_in_model(_empty(), make(tmp_path))


def test_index_with_missing_shard_and_ambiguous_folders(tmp_path, reference):
    index = _sharded(tmp_path, reference)
    os.remove(tmp_path / "model-00002-of-00002.safetensors")
    model = _empty()
    with pytest.raises(FileNotFoundError, match="00002"):
        load_checkpoint_in_model(model, index)
    assert model.embed.weight.device.type == "meta"  # nothing was loaded
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.index.json").write_text("{}")
    (other / "b.index.json").write_text("{}")
    with pytest.raises(ValueError, match="several checkpoint indexes"):
        load_checkpoint_in_model(model, other)


# ------------------------------------------------------------------ keys
def test_strict_mismatch_is_reported_before_loading(tmp_path, reference):
    state = _untied_state(reference)
    state["extra.weight"] = torch.ones(1)
    del state["norm.bias"]
    save_file(state, tmp_path / "model.safetensors")
    model = _empty()
    with pytest.raises(ValueError, match=r"missing keys \['norm.bias'\]; unexpected keys \['extra.weight'\]"):
        load_checkpoint_in_model(model, tmp_path, device_map={"": "cpu"}, strict=True)
    assert all(p.device.type == "meta" for p in model.parameters())


def test_non_strict_skips_unexpected_and_warns(tmp_path, reference, caplog):
    state = _untied_state(reference)
    state["extra.weight"] = torch.ones(1)
    del state["norm.bias"]
    save_file(state, tmp_path / "model.safetensors")
    model = _empty()
    with caplog.at_level(logging.WARNING, logger="hasten.big_modeling.loading"):
        load_checkpoint_in_model(model, tmp_path, device_map={"": "cpu"})
    assert "extra.weight" in caplog.text and "norm.bias" in caplog.text
    assert torch.equal(model.norm.weight, reference.norm.weight)
    assert model.norm.bias.device.type == "meta"


def test_device_map_errors_come_before_loading(safetensors_file):
    model = _empty()
    with pytest.raises(ValueError, match="no device for"):
        load_checkpoint_in_model(model, safetensors_file, device_map={"embed": "cpu", "blocks": "cpu"})
    with pytest.raises(ValueError, match="offload_folder"):
        load_checkpoint_in_model(model, safetensors_file, device_map={"": "cpu", "blocks": "disk"})
    with pytest.raises(ValueError, match="Unknown device"):
        load_checkpoint_in_model(model, safetensors_file, device_map={"": "gpu"})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no accelerator"):
            load_checkpoint_in_model(model, safetensors_file, device_map={"": 0})
    assert all(p.device.type == "meta" for p in model.parameters())


# ------------------------------------------------------------------ dtypes
def test_dtype_and_keep_in_fp32(safetensors_file, reference):
    for dtype in (torch.float16, "bfloat16"):
        model = _empty()
        load_checkpoint_in_model(model, safetensors_file, device_map={"": "cpu"}, dtype=dtype,
                                 keep_in_fp32_modules=["norm"])
        expected = torch.float16 if dtype == torch.float16 else torch.bfloat16
        assert model.blocks[0].fc1.weight.dtype == expected
        assert model.blocks[0].norm.weight.dtype == torch.float32  # "norm" matches every module called norm
        assert model.norm.weight.dtype == torch.float32
        assert torch.equal(model.norm.weight, reference.norm.weight)


def test_keep_in_fp32_matches_whole_names_only(tmp_path):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.wo = nn.Linear(2, 2)
            self.two = nn.Linear(2, 2)

    save_file(M().state_dict(), tmp_path / "m.safetensors")
    with init_empty_weights():
        model = M()
    load_checkpoint_in_model(model, tmp_path / "m.safetensors", device_map={"": "cpu"}, dtype=torch.float16,
                             keep_in_fp32_modules=["wo"])
    assert model.wo.weight.dtype == torch.float32 and model.two.weight.dtype == torch.float16


def test_integer_buffers_keep_their_dtype(tmp_path):
    source = nn.BatchNorm1d(3)
    save_file(source.state_dict(), tmp_path / "bn.safetensors")
    with init_empty_weights(include_buffers=True):
        model = nn.BatchNorm1d(3)
    load_checkpoint_in_model(model, tmp_path / "bn.safetensors", device_map={"": "cpu"}, dtype=torch.float16)
    assert model.num_batches_tracked.dtype == torch.int64 and model.running_mean.dtype == torch.float16


# ------------------------------------------------------------------ offloading while loading
def test_disk_modules_are_written_to_the_offload_folder(tmp_path, safetensors_file, reference):
    model = _empty()
    device_map = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk", "blocks.3": "cpu",
                  "blocks.4": "cpu", "blocks.5": "disk", "norm": "cpu", "head": "cpu"}
    load_checkpoint_in_model(model, safetensors_file, device_map=device_map, offload_folder=tmp_path / "off")
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    assert set(index) == {f"blocks.{i}.{p}" for i in (1, 2, 5) for p in
                          ("norm.weight", "norm.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")}
    assert model.blocks[1].fc1.weight.device.type == "meta"
    assert model.blocks[1].fc1.weight.dtype == torch.float32
    # buffers of disk modules stay in RAM with their checkpoint values (offload_buffers=False)
    assert torch.equal(model.blocks[1].gain, reference.blocks[1].gain)
    assert torch.equal(model.blocks[0].fc1.weight, reference.blocks[0].fc1.weight)


def test_offload_buffers_and_dtype_apply_to_disk(tmp_path, safetensors_file):
    model = _empty()
    load_checkpoint_in_model(model, safetensors_file, device_map={"": "disk"}, offload_folder=tmp_path / "off",
                             offload_buffers=True, dtype=torch.float16)
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    assert "blocks.0.gain" in index and index["blocks.0.fc1.weight"]["dtype"] == "float16"
    assert model.blocks[0].fc1.weight.dtype == torch.float16


def test_offload_state_dict_parks_the_cpu_part_on_disk(safetensors_file, reference, monkeypatch, tmp_path):
    import tempfile

    parked = []
    real_mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: parked.append(real_mkdtemp(dir=tmp_path)) or parked[-1])
    model = _empty()
    load_checkpoint_in_model(model, safetensors_file, device_map={"": "cpu"}, offload_state_dict=True)
    _assert_same_weights(model, reference)
    assert len(parked) == 1 and not os.path.exists(parked[0])  # the parking folder is removed
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]


# ------------------------------------------------------------------ set_module_tensor_to_device
def test_set_module_tensor_to_device_values_and_dtypes():
    model = nn.Sequential(nn.Linear(2, 3))
    weight = model[0].weight
    set_module_tensor_to_device(model, "0.weight", "meta")
    assert model[0].weight.device.type == "meta" and isinstance(model[0].weight, nn.Parameter)
    with pytest.raises(ValueError, match="value is needed"):
        set_module_tensor_to_device(model, "0.weight", "cpu")
    set_module_tensor_to_device(model, "0.weight", "cpu", value=torch.ones(3, 2, dtype=torch.float64))
    assert model[0].weight.dtype == torch.float32 and model[0].weight.requires_grad  # cast to the current dtype
    set_module_tensor_to_device(model, "0.bias", "cpu", value=torch.ones(3), dtype="float16")
    assert model[0].bias.dtype == torch.float16
    with pytest.raises(ValueError, match="shape"):
        set_module_tensor_to_device(model, "0.weight", "cpu", value=torch.ones(2, 2))
    with pytest.raises(ValueError, match="no parameter or buffer"):
        set_module_tensor_to_device(model, "0.nothing", "cpu")
    with pytest.raises(ValueError, match="no submodule"):
        set_module_tensor_to_device(model, "7.weight", "cpu")
    set_module_tensor_to_device(model, "0.weight", "meta", dtype=torch.float16)
    assert model[0].weight.dtype == torch.float16 and model[0].weight.device.type == "meta"
    assert weight.device.type == "cpu"  # the original tensor object is untouched, only the module entry changes


def test_set_module_tensor_to_device_buffers_statistics_and_frozen_parameters():
    bn = nn.BatchNorm1d(2)
    set_module_tensor_to_device(bn, "running_mean", "cpu", value=torch.tensor([1.0, 2.0]), non_blocking=True)
    assert bn.running_mean.tolist() == [1.0, 2.0] and "running_mean" in bn._buffers
    set_module_tensor_to_device(bn, "num_batches_tracked", "cpu", value=torch.tensor(5), dtype=torch.float16)
    assert bn.num_batches_tracked.dtype == torch.int64  # integers never take the float dtype
    bn.weight.requires_grad_(False)
    stats = torch.tensor([3.0])
    set_module_tensor_to_device(bn, "weight", "cpu", value=torch.ones(2), fp16_statistics=stats, clear_cache=False)
    assert not bn.weight.requires_grad and torch.equal(bn.weight.SCB, stats)


def test_set_module_tensor_to_device_reuses_tied_copies():
    model = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    shared = torch.randn(2, 2)
    tied_map = {shared.data_ptr(): {}}
    set_module_tensor_to_device(model, "0.weight", "cpu", value=shared, tied_params_map=tied_map)
    set_module_tensor_to_device(model, "1.weight", "cpu", value=shared, tied_params_map=tied_map)
    assert model[0].weight is model[1].weight  # placed once, reused for the second name
    assert tied_map[shared.data_ptr()]["cpu"] is model[0].weight
