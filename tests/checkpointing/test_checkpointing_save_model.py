"""save_model: one safetensors file, or shards with an index, that big-model loading and safetensors read back."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from hasten import Accelerator, load_checkpoint_in_model
from hasten.checkpointing.save_model import shard_names, split_into_shards
from hasten.state import AcceleratorState


class TiedLM(nn.Module):
    def __init__(self, vocab=50, width=16, layers=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight


def accelerator():
    AcceleratorState._reset_state(True)
    return Accelerator(cpu=True)


def read_folder(folder):
    """Every tensor in a save_model folder, following the index when there is one (read with safetensors/torch)."""
    names = os.listdir(folder)
    index = [n for n in names if n.endswith(".index.json")]
    files = sorted(set(json.loads((folder / index[0]).read_text())["weight_map"].values())) if index else \
        [n for n in names if n in ("model.safetensors", "pytorch_model.bin")]
    tensors = {}
    for name in files:
        tensors.update(load_file(folder / name) if name.endswith(".safetensors") else torch.load(folder / name))
    return tensors


def test_a_small_model_is_one_safetensors_file_with_tied_weights_once(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    accelerator().save_model(model, tmp_path)
    assert os.listdir(tmp_path) == ["model.safetensors"]
    saved = load_file(tmp_path / "model.safetensors")
    expected = model.state_dict()
    assert set(saved) == set(expected) - {"head.weight"}  # stored once, under the first name
    assert all(torch.equal(saved[k], expected[k]) for k in saved)


def test_a_large_model_is_sharded_with_an_index_that_loading_reads(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    limit = 2000  # bytes: embedding (3200 B) alone, then the linear layers two by two
    accelerator().save_model(model, tmp_path, max_shard_size=limit)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    assert sorted(os.listdir(tmp_path)) == sorted(shards + ["model.safetensors.index.json"])
    unique = {k: v for k, v in model.state_dict().items() if k != "head.weight"}
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in unique.values())
    assert set(index["weight_map"]) == set(unique)
    for name in shards:
        tensors = load_file(tmp_path / name)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        assert size <= limit or len(tensors) == 1  # only a tensor larger than the limit exceeds it, alone
    torch.manual_seed(1)
    fresh = TiedLM()
    load_checkpoint_in_model(fresh, str(tmp_path))
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_splitting_follows_the_state_dict_order():
    tensors = {"a": torch.zeros(10), "b": torch.zeros(10), "c": torch.zeros(100), "d": torch.zeros(5)}
    assert split_into_shards(tensors, 80) == [["a", "b"], ["c"], ["d"]]
    assert split_into_shards(tensors, 10_000) == [["a", "b", "c", "d"]]
    assert shard_names(1, True) == ["model.safetensors"]
    assert shard_names(2, False) == ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]


def test_pickled_shards_keep_tied_names(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    accelerator().save_model(model, tmp_path, max_shard_size="2KB", safe_serialization=False)
    assert "pytorch_model.bin.index.json" in os.listdir(tmp_path)
    loaded = read_folder(tmp_path)
    assert set(loaded) == set(model.state_dict())  # pickle shares storage: the tied name costs nothing
    assert loaded["head.weight"].data_ptr() == loaded["embed.weight"].data_ptr()


def test_saving_again_removes_stale_shards_and_keeps_other_files(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    saver = accelerator()
    saver.save_model(model, tmp_path, max_shard_size=1000)
    (tmp_path / "config.json").write_text("{}")
    saver.save_model(model, tmp_path)  # now one file: shards and index of the earlier save are stale
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_the_reference_library_writes_the_same_layout(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)])
    accelerator().save_model(model, tmp_path / "hasten", max_shard_size=1500)
    accelerate.state.AcceleratorState._reset_state(True)
    accelerate.Accelerator(cpu=True).save_model(model, tmp_path / "reference", max_shard_size=1500)
    accelerate.state.AcceleratorState._reset_state(True)
    assert sorted(os.listdir(tmp_path / "hasten")) == sorted(os.listdir(tmp_path / "reference"))
    ours = json.loads((tmp_path / "hasten" / "model.safetensors.index.json").read_text())
    theirs = json.loads((tmp_path / "reference" / "model.safetensors.index.json").read_text())
    assert ours["weight_map"] == theirs["weight_map"] and ours["metadata"]["total_size"] == \
        theirs["metadata"]["total_size"]
    a, b = read_folder(tmp_path / "hasten"), read_folder(tmp_path / "reference")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bad_input_is_refused(tmp_path):
    saver = accelerator()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        saver.save_model(nn.Linear(2, 2), tmp_path / "file")
    with pytest.raises(ValueError, match="Cannot read 'huge' as a size"):
        saver.save_model(nn.Linear(2, 2), tmp_path / "m", max_shard_size="huge")
    with pytest.raises(ValueError, match="meta device"):
        saver.save_model(nn.Linear(2, 2, device="meta"), tmp_path / "m")
    assert not (tmp_path / "m").exists()
