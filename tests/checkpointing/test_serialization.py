import io
import os
import pickle
import random
import stat

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load as safetensors_load_bytes
from safetensors.torch import load_file as safetensors_load_file

from hasten.state import PartialState
from hasten.utils import load, save


class NotAWeight:
    def __init__(self, value):
        self.value = value


def leftovers(folder, keep):
    return sorted(name for name in os.listdir(folder) if name != keep)


def as_process(process_index, local_process_index):
    PartialState()
    PartialState._shared_state.update(process_index=process_index, local_process_index=local_process_index)


# ----------------------------------------------------------------------------- pickle format
def test_round_trip(tmp_path):
    obj = {"weight": torch.randn(3, 4), "step": 7, "nested": [torch.arange(5), {"lr": 0.1}]}
    save(obj, tmp_path / "ckpt.pt")
    loaded = load(tmp_path / "ckpt.pt")
    assert torch.equal(loaded["weight"], obj["weight"]) and loaded["step"] == 7
    assert torch.equal(loaded["nested"][0], obj["nested"][0]) and loaded["nested"][1] == {"lr": 0.1}
    assert leftovers(tmp_path, "ckpt.pt") == []


def test_string_path_and_file_object(tmp_path):
    save({"a": torch.ones(2)}, str(tmp_path / "a.pt"))
    assert torch.equal(load(str(tmp_path / "a.pt"))["a"], torch.ones(2))
    buffer = io.BytesIO()
    save({"b": torch.zeros(3)}, buffer)
    buffer.seek(0)
    assert torch.equal(load(buffer)["b"], torch.zeros(3))


def test_load_is_weights_only_by_default(tmp_path):
    torch.save({"x": NotAWeight(3)}, tmp_path / "objects.pt")
    with pytest.raises(pickle.UnpicklingError):
        load(tmp_path / "objects.pt")
    assert load(tmp_path / "objects.pt", weights_only=False)["x"].value == 3


def test_numpy_and_python_rng_states_load_weights_only(tmp_path):
    states = {"numpy": np.random.get_state(), "python": random.getstate(), "array": np.arange(4.0),
              "scalar": np.float64(2.5)}
    save(states, tmp_path / "rng.pt")
    loaded = load(tmp_path / "rng.pt")
    np.random.set_state(loaded["numpy"])
    first = np.random.rand(3)
    np.random.set_state(states["numpy"])
    assert np.array_equal(first, np.random.rand(3))
    assert loaded["python"] == states["python"]
    assert np.array_equal(loaded["array"], states["array"]) and loaded["scalar"] == 2.5


def test_map_location_is_passed_to_torch_load(tmp_path):
    save({"w": torch.ones(2)}, tmp_path / "m.pt")
    assert load(tmp_path / "m.pt", map_location="meta")["w"].device.type == "meta"


def test_file_permissions_are_the_usual_ones(tmp_path):
    save({"w": torch.ones(1)}, tmp_path / "saved.pt")
    with open(tmp_path / "plain.pt", "wb"):
        pass
    assert stat.S_IMODE(os.stat(tmp_path / "saved.pt").st_mode) == stat.S_IMODE(os.stat(tmp_path / "plain.pt").st_mode)


# ----------------------------------------------------------------------------- atomic writes
def test_failed_pickle_leaves_the_previous_file_intact(tmp_path):
    target = tmp_path / "ckpt.pt"
    save({"version": 1, "w": torch.ones(100)}, target)
    before = target.read_bytes()
    with pytest.raises(Exception):
        save({"version": 2, "w": torch.zeros(100), "bad": lambda: None}, target)  # lambdas cannot be pickled
    assert target.read_bytes() == before
    assert load(target)["version"] == 1
    assert leftovers(tmp_path, "ckpt.pt") == []


def test_write_failing_midway_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    target = tmp_path / "ckpt.pt"
    save({"version": 1}, target)
    before = target.read_bytes()

    def half_write_then_fail(obj, f, *args, **kwargs):
        with open(f, "wb") if isinstance(f, (str, os.PathLike)) else open(os.devnull, "wb") as handle:
            handle.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half_write_then_fail)
    with pytest.raises(OSError, match="No space left"):
        save({"version": 2}, target)
    assert target.read_bytes() == before
    assert leftovers(tmp_path, "ckpt.pt") == []


def test_safetensors_write_failing_midway_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    import safetensors.torch

    target = tmp_path / "model.safetensors"
    save({"w": torch.ones(4)}, target, safe_serialization=True)
    before = target.read_bytes()

    def half_write_then_fail(tensors, filename, metadata=None):
        with open(filename, "wb") as handle:
            handle.write(b"\x00" * 10)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", half_write_then_fail)
    with pytest.raises(OSError):
        save({"w": torch.zeros(4)}, target, safe_serialization=True)
    assert target.read_bytes() == before
    assert leftovers(tmp_path, "model.safetensors") == []


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save({"w": torch.ones(1)}, tmp_path / "nowhere" / "ckpt.pt")
    assert not (tmp_path / "nowhere").exists()


# ----------------------------------------------------------------------------- safetensors
def test_safetensors_file_is_readable_by_safetensors(tmp_path):
    state = {"linear.weight": torch.randn(4, 3), "linear.bias": torch.randn(4), "ints": torch.arange(6)}
    save(state, tmp_path / "model.safetensors", safe_serialization=True)
    read = safetensors_load_file(str(tmp_path / "model.safetensors"))
    assert read.keys() == state.keys() and all(torch.equal(read[k], state[k]) for k in state)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}
    loaded = load(tmp_path / "model.safetensors")
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_tied_and_view_tensors_keep_every_key(tmp_path):
    shared = torch.randn(6, 4)
    state = {"embed.weight": shared, "lm_head.weight": shared, "first_rows": shared[:2],
             "transposed": torch.randn(3, 5).t()}
    save(state, tmp_path / "tied.safetensors", safe_serialization=True)
    read = safetensors_load_file(str(tmp_path / "tied.safetensors"))
    assert read.keys() == state.keys()
    assert all(torch.equal(read[k], state[k]) for k in state)
    assert state["embed.weight"] is shared  # the caller's dict is not modified


def test_a_tied_state_dict_loads_back_strictly(tmp_path):
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight
    save(model.state_dict(), tmp_path / "model.safetensors", safe_serialization=True)
    fresh = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    fresh.load_state_dict(load(tmp_path / "model.safetensors"), strict=True)
    assert torch.equal(fresh[1].weight, model[0].weight)


@pytest.mark.parametrize("obj, message", [
    ([torch.ones(1)], "dict of tensors"),
    ({"w": torch.ones(1), "step": 3}, "tensor values"),
    ({1: torch.ones(1)}, "string keys"),
])
def test_safetensors_needs_a_dict_of_tensors(tmp_path, obj, message):
    with pytest.raises(TypeError, match=message):
        save(obj, tmp_path / "bad.safetensors", safe_serialization=True)
    assert os.listdir(tmp_path) == []


def test_safetensors_to_a_file_object():
    buffer = io.BytesIO()
    save({"w": torch.arange(3.0)}, buffer, safe_serialization=True)
    assert torch.equal(safetensors_load_bytes(buffer.getvalue())["w"], torch.arange(3.0))


def test_safetensors_load_options(tmp_path):
    save({"w": torch.ones(2)}, tmp_path / "w.safetensors", safe_serialization=True)
    assert load(tmp_path / "w.safetensors", map_location=torch.device("cpu"))["w"].device.type == "cpu"
    assert torch.equal(load(tmp_path / "w.safetensors", weights_only=True)["w"], torch.ones(2))
    with pytest.raises(TypeError, match="must be a device"):
        load(tmp_path / "w.safetensors", map_location={"cuda:0": "cpu"})
    with pytest.raises(TypeError, match="do not apply"):
        load(tmp_path / "w.safetensors", mmap=True)


# ----------------------------------------------------------------------------- which process writes
@pytest.mark.parametrize("process_index, local_process_index, save_on_each_node, writes", [
    (0, 0, False, True),
    (1, 1, False, False),
    (2, 0, False, False),  # local main of a second machine: only the global main writes by default
    (2, 0, True, True),  # ... unless every node saves
    (3, 1, True, False),
])
def test_only_the_main_process_writes(tmp_path, process_index, local_process_index, save_on_each_node, writes):
    as_process(process_index, local_process_index)
    for safe, name in ((False, "c.pt"), (True, "c.safetensors")):
        save({"w": torch.ones(1)}, tmp_path / name, save_on_each_node=save_on_each_node, safe_serialization=safe)
        assert (tmp_path / name).exists() is writes


def test_files_from_accelerate_load(tmp_path):
    accelerate_utils = pytest.importorskip("accelerate.utils")
    state = {"w": torch.randn(3), "b": torch.randn(2)}
    accelerate_utils.save(state, tmp_path / "acc.safetensors", safe_serialization=True)
    accelerate_utils.save({"state": state, "step": 3}, tmp_path / "acc.pt")
    assert all(torch.equal(load(tmp_path / "acc.safetensors")[k], state[k]) for k in state)
    assert load(tmp_path / "acc.pt")["step"] == 3


def test_bad_safetensors_input_fails_on_every_process(tmp_path):
    """Not only on the writer: a process that skipped the check would run on and hang at the next collective."""
    as_process(1, 1)
    with pytest.raises(TypeError, match="dict of tensors"):
        save([torch.ones(1)], tmp_path / "bad.safetensors", safe_serialization=True)


def test_sparse_tensors_are_refused(tmp_path):
    with pytest.raises(TypeError, match="sparse"):
        save({"s": torch.eye(3).to_sparse()}, tmp_path / "s.safetensors", safe_serialization=True)
    assert os.listdir(tmp_path) == []
