"""save_state / load_state in one process: what is saved, what comes back, hooks, registered objects, bad input."""
import json
import os
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.checkpointing import CheckpointNotFoundError, IncompleteCheckpointError
from hasten.state import AcceleratorState, GradientState
from fixtures import Counter


def fresh():
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def build(seed=0, dropout=0.0, **accelerator_kwargs):
    fresh()
    torch.manual_seed(seed)
    accelerator = Accelerator(cpu=True, **accelerator_kwargs)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Dropout(dropout), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(24, 3, generator=g), torch.randn(24, 1, generator=g))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    return (accelerator, *accelerator.prepare(model, optimizer, loader, scheduler))


def step(accelerator, model, optimizer, scheduler, batch):
    x, y = batch
    accelerator.backward(nn.functional.mse_loss(model(x), y))
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_save_state_writes_the_reference_layout_and_a_completion_marker(tmp_path):
    accelerator, model, optimizer, loader, scheduler = build()
    accelerator.register_for_checkpointing(Counter(3), Counter(4))
    folder = accelerator.save_state(tmp_path / "ckpt")
    names = sorted(os.listdir(folder))
    assert names == ["custom_checkpoint_0.pkl", "custom_checkpoint_1.pkl", "hasten_checkpoint.json",
                     "loader_states_0.bin", "model.safetensors", "optimizer.bin", "random_states_0.pkl",
                     "scheduler.bin"]
    marker = json.loads((tmp_path / "ckpt" / "hasten_checkpoint.json").read_text())
    assert marker["complete"] is True and marker["num_processes"] == 1
    assert marker["files"] == {name: os.path.getsize(os.path.join(folder, name))
                               for name in names if name != "hasten_checkpoint.json"}
    # the model file holds the unwrapped model's keys and values
    assert {k: v for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}.keys() == \
        model.state_dict().keys()
    assert not any(name.startswith(".") for name in os.listdir(tmp_path))  # no staging folder left


def test_load_state_restores_everything_saved(tmp_path):
    accelerator, model, optimizer, loader, scheduler = build(dropout=0.2)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    batches = iter(loader)
    for _ in range(3):
        step(accelerator, model, optimizer, scheduler, next(batches))
    counter.value = 17
    accelerator._accumulator.step = 5
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    accelerator.save_state(tmp_path / "ckpt")
    expected = {
        "params": params(model), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "python": random.random(), "numpy": np.random.rand(), "torch": torch.rand(2), "next_batch": next(batches),
    }

    accelerator, model, optimizer, loader, scheduler = build(seed=1, dropout=0.2)  # other weights, fresh loader
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    assert not all(torch.equal(a, b) for a, b in zip(params(model), expected["params"]))
    returned = accelerator.load_state(tmp_path / "ckpt")
    assert returned == str(tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(params(model), expected["params"]))
    state = optimizer.state_dict()
    for index, saved in expected["optimizer"]["state"].items():
        assert all(torch.equal(state["state"][index][key], value) for key, value in saved.items())
    assert state["param_groups"] == expected["optimizer"]["param_groups"]
    assert scheduler.state_dict() == expected["scheduler"]
    assert counter.value == 17
    assert accelerator._accumulator.step == 5
    assert random.random() == expected["python"]
    assert np.random.rand() == expected["numpy"]
    assert torch.equal(torch.rand(2), expected["torch"])
    first = next(iter(loader))  # the loader continues with the batch after the saved position
    assert all(torch.equal(a, b) for a, b in zip(first, expected["next_batch"]))


def test_a_resumed_single_process_run_with_dropout_ends_bitwise_equal(tmp_path):
    def run(stop_after=None, resume=False):
        accelerator, model, optimizer, loader, scheduler = build(dropout=0.5)
        done = Counter()
        accelerator.register_for_checkpointing(done)
        if resume:
            accelerator.load_state(tmp_path / "mid")
        for epoch in range(2):
            for batch in loader:
                step(accelerator, model, optimizer, scheduler, batch)
                done.value += 1
                if done.value == stop_after:
                    accelerator.save_state(tmp_path / "mid")
                    return None
            if resume and done.value >= 12:
                break
        return params(model)

    uninterrupted = run()
    run(stop_after=8)  # the second epoch, 2 batches in
    resumed = run(resume=True)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted, resumed))


@pytest.mark.filterwarnings("ignore:fp16 mixed precision on the CPU")
def test_gradient_scaler_state_round_trips(tmp_path):
    accelerator, model, optimizer, loader, scheduler = build(mixed_precision="fp16")
    accelerator.scaler.scale(torch.ones(()))  # the scale exists once used
    accelerator.scaler.update(1024.0)
    accelerator.save_state(tmp_path / "ckpt")
    assert os.path.isfile(tmp_path / "ckpt" / "scaler.pt")
    accelerator, *_ = build(mixed_precision="fp16")
    accelerator.scaler.scale(torch.ones(()))
    assert accelerator.scaler.get_scale() != 1024.0
    accelerator.load_state(tmp_path / "ckpt")
    assert accelerator.scaler.get_scale() == 1024.0


def test_pickled_models_with_safe_serialization_false(tmp_path):
    accelerator, model, *_ = build()
    accelerator.save_state(tmp_path / "ckpt", safe_serialization=False)
    assert os.path.isfile(tmp_path / "ckpt" / "pytorch_model.bin")
    assert not os.path.exists(tmp_path / "ckpt" / "model.safetensors")
    saved = params(model)
    accelerator, model, *_ = build(seed=3)
    accelerator.load_state(tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(params(model), saved))


def test_several_models_and_optimizers_are_numbered_like_the_reference(tmp_path):
    fresh()
    accelerator = Accelerator(cpu=True)
    first, second = nn.Linear(2, 2), nn.Linear(3, 1)
    prepared = accelerator.prepare(first, second, torch.optim.SGD(first.parameters(), lr=0.1),
                                   torch.optim.SGD(second.parameters(), lr=0.1))
    folder = accelerator.save_state(tmp_path / "ckpt")
    assert {"model.safetensors", "model_1.safetensors", "optimizer.bin", "optimizer_1.bin"} <= set(os.listdir(folder))
    assert load_file(os.path.join(folder, "model_1.safetensors"))["weight"].shape == (1, 3)
    with torch.no_grad():
        prepared[1].weight.zero_()
    accelerator.load_state(folder)
    assert torch.equal(prepared[1].weight, second.weight) and prepared[1].weight.abs().sum() > 0


def test_tied_weights_are_stored_once_and_come_back_tied(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(5, 4)
            self.head = nn.Linear(4, 5, bias=False)
            self.head.weight = self.embed.weight

    fresh()
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(Tied())
    accelerator.save_state(tmp_path / "ckpt")
    assert list(load_file(tmp_path / "ckpt" / "model.safetensors")) == ["embed.weight"]
    saved = model.embed.weight.detach().clone()
    fresh()
    torch.manual_seed(1)
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(Tied())
    accelerator.load_state(tmp_path / "ckpt")
    assert torch.equal(model.embed.weight, saved) and model.head.weight is model.embed.weight


def test_model_keys_saved_with_a_wrapper_prefix_still_load(tmp_path):
    """A DDP model's own state_dict() has `module.` in front; such files (and `_orig_mod.` from torch.compile) load."""
    accelerator, model, *_ = build()
    accelerator.save_state(tmp_path / "ckpt", safe_serialization=False)
    path = tmp_path / "ckpt" / "pytorch_model.bin"
    state = torch.load(path)
    torch.save({f"module._orig_mod.{k}": v for k, v in state.items()}, path)
    os.remove(tmp_path / "ckpt" / "hasten_checkpoint.json")  # the file was edited: as if another tool wrote it
    accelerator, model, *_ = build(seed=4)
    accelerator.load_state(tmp_path / "ckpt")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_save_and_load_hooks_run_and_their_handles_remove_them(tmp_path):
    accelerator, model, *_ = build()
    calls = []

    def save_hook(models, weights, folder):
        calls.append(("save", len(models), len(weights)))
        with open(os.path.join(folder, "config.json"), "w") as handle:
            handle.write("{}")

    def load_hook(models, folder):
        calls.append(("load", len(models), os.path.isfile(os.path.join(folder, "config.json"))))

    save_handle = accelerator.register_save_state_pre_hook(save_hook)
    load_handle = accelerator.register_load_state_pre_hook(load_hook)
    accelerator.save_state(tmp_path / "ckpt")
    accelerator.load_state(tmp_path / "ckpt")
    marker = json.loads((tmp_path / "ckpt" / "hasten_checkpoint.json").read_text())
    assert "config.json" in marker["files"]  # written by the hook into the staged folder: part of the checkpoint
    assert calls == [("save", 1, 1), ("load", 1, True)]
    save_handle.remove()
    load_handle.remove()
    with pytest.raises(TypeError, match="takes a function, got str"):
        accelerator.register_save_state_pre_hook("not a function")
    accelerator.save_state(tmp_path / "ckpt")
    accelerator.load_state(tmp_path / "ckpt")
    assert len(calls) == 2


def test_a_save_hook_can_take_a_model_out_of_the_files(tmp_path):
    accelerator, model, *_ = build()
    accelerator.register_save_state_pre_hook(lambda models, weights, folder: weights.clear())
    accelerator.save_state(tmp_path / "ckpt")
    assert not os.path.exists(tmp_path / "ckpt" / "model.safetensors")


def test_register_for_checkpointing_names_objects_without_state_dict():
    accelerator, *_ = build()
    with pytest.raises(ValueError, match=r"Item at index 1 \(int\) has no state_dict and no load_state_dict"):
        accelerator.register_for_checkpointing(Counter(), 3)
    assert accelerator._custom_objects == []  # nothing registered when one is invalid


def test_a_different_set_of_registered_objects_is_refused_before_anything_loads(tmp_path):
    accelerator, model, *_ = build()
    accelerator.register_for_checkpointing(Counter(1))
    accelerator.save_state(tmp_path / "ckpt")
    accelerator, model, *_ = build(seed=2)
    before = params(model)
    accelerator.register_for_checkpointing(Counter(), Counter())
    with pytest.raises(IncompleteCheckpointError, match="holds 1 registered object.*registered 2"):
        accelerator.load_state(tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(params(model), before))


def test_missing_optimizer_file_is_reported_before_the_model_is_touched(tmp_path):
    fresh()
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(2, 2))
    accelerator.save_state(tmp_path / "model_only")  # saved without an optimizer
    accelerator, model, *_ = build()
    before = params(model)
    with pytest.raises(IncompleteCheckpointError, match=r"optimizer\.bin \(optimizer 0\) is missing"):
        accelerator.load_state(tmp_path / "model_only")
    assert all(torch.equal(a, b) for a, b in zip(params(model), before))


def test_bad_arguments_are_clear_errors(tmp_path):
    accelerator, *_ = build()
    with pytest.raises(ValueError, match="needs an output_dir"):
        accelerator.save_state()
    with pytest.raises(TypeError, match=r"\['tag'\].*takes none"):
        accelerator.save_state(tmp_path / "x", tag="deepspeed-only")
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        accelerator.load_state(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="needs an input_dir"):
        accelerator.load_state()
    accelerator.save_state(tmp_path / "ckpt")
    with pytest.raises(TypeError, match=r"\['weights_only'\].*load_kwargs"):
        accelerator.load_state(tmp_path / "ckpt", weights_only=False)
    with pytest.raises(ValueError, match="map_location must be one of"):
        accelerator.load_state(tmp_path / "ckpt", map_location="cuda:3")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="it is a file"):
        accelerator.save_state(tmp_path / "file")


def test_strict_false_loads_a_model_with_extra_weights(tmp_path):
    fresh()
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(nn.Linear(2, 2))
    accelerator.save_state(tmp_path / "ckpt")
    fresh()
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(nn.Sequential(nn.Linear(2, 2)))  # keys "0.weight" ... do not match
    with pytest.raises(RuntimeError, match="Missing key"):
        accelerator.load_state(tmp_path / "ckpt")
    fresh()
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(2, 2)
    model.register_buffer("extra", torch.ones(1))
    model = accelerator.prepare(model)
    accelerator.load_state(tmp_path / "ckpt", strict=False)


def test_saving_into_an_existing_folder_replaces_the_checkpoint_and_keeps_other_files(tmp_path):
    fresh()
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(nn.Linear(2, 2), nn.Linear(2, 1))
    accelerator.save_state(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "notes.txt").write_text("mine")
    accelerator, model, *_ = build()
    accelerator.save_state(tmp_path / "ckpt")
    names = set(os.listdir(tmp_path / "ckpt"))
    assert "notes.txt" in names  # not a checkpoint file: carried over
    assert "model_1.safetensors" not in names  # the previous checkpoint's file: gone with it
    assert (tmp_path / "ckpt" / "notes.txt").read_text() == "mine"
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]


def test_the_working_folder_cannot_be_replaced(tmp_path, monkeypatch):
    accelerator, *_ = build()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="current working folder is inside it"):
        accelerator.save_state(".")


def test_loader_positions_from_another_process_count_are_skipped_with_a_warning(tmp_path, caplog):
    accelerator, model, optimizer, loader, scheduler = build()
    next(iter(loader))
    accelerator.save_state(tmp_path / "ckpt")
    marker_path = tmp_path / "ckpt" / "hasten_checkpoint.json"
    marker = json.loads(marker_path.read_text())
    marker["num_processes"] = 4
    marker_path.write_text(json.dumps(marker))
    accelerator, model, optimizer, loader, scheduler = build()
    torch.manual_seed(99)
    expected_random = torch.rand(1)
    torch.manual_seed(99)
    with caplog.at_level("WARNING"):
        accelerator.load_state(tmp_path / "ckpt")
    assert "saved by 4 processes" in caplog.text
    assert torch.equal(torch.rand(1), expected_random)  # random states not restored
