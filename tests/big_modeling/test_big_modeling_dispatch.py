"""Dispatch and offload: a model split over cpu / disk (and meta) gives exactly the fully loaded model's outputs."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

import hasten
from big_modeling_models import TinyLM, trained_tiny_lm
from hasten.big_modeling import (compute_module_sizes, cpu_offload, cpu_offload_with_hook, disk_offload,
                                 dispatch_model, find_tied_parameters, init_empty_weights, load_checkpoint_and_dispatch,
                                 remove_hook_from_submodules)

IDS = torch.tensor([[1, 5, 7, 2], [3, 3, 9, 0]])
HALF_ON_DISK = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "cpu", "blocks.3": "disk",
                "blocks.4": "disk", "blocks.5": "cpu", "norm": "cpu", "head": "cpu"}


@pytest.fixture
def reference():
    return trained_tiny_lm(seed=3)


@pytest.fixture
def checkpoint(tmp_path, reference):
    state = {k: v.contiguous() for k, v in reference.state_dict().items() if k != "head.weight"}
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    return tmp_path / "model.safetensors"


def _empty():
    with init_empty_weights():
        return TinyLM()


@torch.no_grad()
def test_half_the_blocks_on_disk_gives_identical_outputs(tmp_path, reference, checkpoint):
    model = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map=HALF_ON_DISK, offload_folder=tmp_path / "off")
    assert torch.equal(model(IDS), reference(IDS))
    assert torch.equal(model(IDS, scale=torch.tensor(2.0)), reference(IDS, scale=torch.tensor(2.0)))  # kwargs too
    assert model.blocks[1].fc1.weight.device.type == "meta"  # still offloaded after the forward
    assert model.blocks[0].fc1.weight.device.type == "cpu"
    assert model.hf_device_map == HALF_ON_DISK
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]
    with pytest.raises(RuntimeError, match="cannot be moved"):
        model.to("cpu")


@torch.no_grad()
@pytest.mark.parametrize("strategy", ["auto", "balanced", "balanced_low_0", "sequential"])
def test_strategies_plan_load_and_run(tmp_path, reference, checkpoint, strategy):
    model = _empty()
    total = compute_module_sizes(model)[""]
    model = load_checkpoint_and_dispatch(model, checkpoint, device_map=strategy, max_memory={"cpu": int(total * 0.6)},
                                         no_split_module_classes=["TinyBlock"], offload_folder=tmp_path / "off")
    assert "disk" in model.hf_device_map.values()
    assert torch.equal(model(IDS), reference(IDS))


@torch.no_grad()
def test_dtype_is_applied_while_loading(tmp_path, reference, checkpoint):
    model = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map=HALF_ON_DISK, offload_folder=tmp_path / "off",
                                         dtype=torch.bfloat16)
    expected = reference.to(torch.bfloat16)(IDS)
    assert torch.equal(model(IDS), expected)


def test_bad_arguments_fail_before_loading(tmp_path, checkpoint):
    model = _empty()
    with pytest.raises(ValueError, match="not a strategy"):
        load_checkpoint_and_dispatch(model, checkpoint, device_map="fastest")
    with pytest.raises(ValueError, match="offload_folder"):
        load_checkpoint_and_dispatch(model, checkpoint, device_map=HALF_ON_DISK)
    with pytest.raises(ValueError, match="no device for"):
        load_checkpoint_and_dispatch(model, checkpoint, device_map={"embed": "cpu"})
    with pytest.raises(FileNotFoundError):
        load_checkpoint_and_dispatch(model, tmp_path / "missing.safetensors", device_map={"": "cpu"})
    assert all(p.device.type == "meta" for p in model.parameters())


@torch.no_grad()
def test_without_a_device_map_weights_are_just_loaded(reference, checkpoint):
    model = load_checkpoint_and_dispatch(_empty(), checkpoint)
    assert not hasattr(model, "_hf_hook") and torch.equal(model(IDS), reference(IDS))


@torch.no_grad()
def test_dispatch_a_loaded_model_writes_its_disk_part(tmp_path, reference):
    expected = reference(IDS)
    model = dispatch_model(reference, HALF_ON_DISK, offload_dir=tmp_path / "off")
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    assert "blocks.3.fc2.weight" in index and "blocks.0.fc1.weight" not in index
    assert "blocks.3.gain" not in index  # buffers stay in memory unless offload_buffers
    assert torch.equal(model(IDS), expected)
    remove_hook_from_submodules(model)
    assert not hasattr(model, "_hf_hook") and "to" not in model.__dict__


@torch.no_grad()
def test_dispatch_with_an_offload_index_and_offloaded_buffers(tmp_path, reference):
    expected = reference(IDS)
    model = dispatch_model(reference, HALF_ON_DISK, offload_dir=tmp_path / "off", offload_buffers=True)
    assert "blocks.3.gain" in json.loads((tmp_path / "off" / "index.json").read_text())
    assert torch.equal(model(IDS), expected)


def test_dispatch_checks_the_map_and_the_offload_folder(tmp_path, reference):
    with pytest.raises(ValueError, match="no device for"):
        dispatch_model(reference, {"embed": "cpu"})
    with pytest.raises(ValueError, match="offload_dir"):
        dispatch_model(reference, HALF_ON_DISK)
    with pytest.raises(ValueError, match="holds none either"):
        dispatch_model(_empty(), HALF_ON_DISK, offload_dir=tmp_path / "empty")


def test_one_device_means_a_plain_move(reference):
    model = dispatch_model(reference, {"": "meta"})
    assert model.embed.weight.device.type == "meta" and not hasattr(model, "_hf_hook")
    assert model.hf_device_map == {"": "meta"}


@torch.no_grad()
def test_force_hooks_on_a_single_device(reference):
    expected = reference(IDS)
    model = dispatch_model(reference, {"": "cpu"}, force_hooks=True)
    assert hasattr(model, "_hf_hook") and torch.equal(model(IDS), expected)


@torch.no_grad()
def test_cpu_offload_runs_identically_and_keeps_weights_off_between_calls(reference):
    expected = reference(IDS)
    model = cpu_offload(reference, execution_device="cpu")
    assert model.blocks[2].fc1.weight.device.type == "meta"
    assert torch.equal(model(IDS), expected) and torch.equal(model(IDS), expected)
    assert model.blocks[2].fc1.weight.device.type == "meta"


@torch.no_grad()
def test_disk_offload_writes_once_and_reuses_the_folder(tmp_path, reference):
    expected = reference(IDS)
    twin = trained_tiny_lm(seed=3)
    model = disk_offload(reference, tmp_path / "off")
    assert torch.equal(model(IDS), expected)
    written = os.path.getmtime(tmp_path / "off" / "index.json")
    again = disk_offload(twin, tmp_path / "off", execution_device="cpu")
    assert os.path.getmtime(tmp_path / "off" / "index.json") == written
    assert torch.equal(again(IDS), expected)


@torch.no_grad()
def test_cpu_offload_with_hook_chains_models(reference):
    expected = reference(IDS)
    first, first_hook = cpu_offload_with_hook(reference, "cpu")
    second, _ = cpu_offload_with_hook(trained_tiny_lm(seed=4), "cpu", prev_module_hook=first_hook)
    assert torch.equal(first(IDS), expected)
    second(IDS)
    first_hook.remove()
    assert not hasattr(first, "_hf_hook")


def test_top_level_exports():
    assert hasten.dispatch_model is dispatch_model and hasten.load_checkpoint_and_dispatch is load_checkpoint_and_dispatch
    assert hasten.cpu_offload is cpu_offload and hasten.disk_offload is disk_offload
