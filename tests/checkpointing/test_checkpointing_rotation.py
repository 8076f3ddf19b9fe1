"""Automatic checkpoint naming, total_limit, picking the newest complete checkpoint, auto_resume."""
import os
import shutil

import pytest
import torch
from torch import nn

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpointing import CheckpointNotFoundError, auto_resume, latest_checkpoint
from hasten.checkpointing.layout import automatic_folder, automatic_iteration
from hasten.state import AcceleratorState, GradientState


def build(project_dir, seed=0, **project):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch.manual_seed(seed)
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=str(project_dir), automatic_checkpoint_naming=True, **project))
    model = accelerator.prepare(nn.Linear(2, 2))
    return accelerator, model


def listing(project_dir):
    return sorted(os.listdir(os.path.join(project_dir, "checkpoints")), key=lambda n: (len(n), n))


def test_folder_names():
    assert automatic_folder("run", 7) == os.path.join("run", "checkpoints", "checkpoint_7")
    assert automatic_iteration("/x/checkpoints/checkpoint_12") == 12
    assert automatic_iteration("checkpoint_12/") == 12
    assert automatic_iteration("checkpoint_x") is None and automatic_iteration(".checkpoint_3.incomplete") is None


def test_automatic_naming_counts_up_and_total_limit_keeps_the_newest(tmp_path):
    accelerator, model = build(tmp_path, total_limit=2)
    folders = [accelerator.save_state() for _ in range(4)]
    assert [os.path.basename(f) for f in folders] == ["checkpoint_0", "checkpoint_1", "checkpoint_2", "checkpoint_3"]
    assert accelerator.save_iteration == 4
    assert listing(tmp_path) == ["checkpoint_2", "checkpoint_3"]


def test_output_dir_is_ignored_with_automatic_naming(tmp_path, caplog):
    accelerator, model = build(tmp_path)
    with caplog.at_level("WARNING"):
        folder = accelerator.save_state(tmp_path / "elsewhere")
    assert folder == automatic_folder(str(tmp_path), 0) and "is ignored" in caplog.text
    assert not (tmp_path / "elsewhere").exists()


def test_total_limit_never_deletes_the_checkpoint_just_written(tmp_path):
    accelerator, model = build(tmp_path, total_limit=1)
    accelerator.project_configuration.iteration = 5
    accelerator.save_state()
    accelerator.project_configuration.iteration = 2  # a lower number than the existing one
    accelerator.save_state()
    assert listing(tmp_path) == ["checkpoint_2"]


def test_an_existing_folder_is_not_overwritten(tmp_path):
    accelerator, model = build(tmp_path)
    accelerator.save_state()
    accelerator, model = build(tmp_path)  # a new run in the same project, iteration 0 again
    with pytest.raises(ValueError, match=r"checkpoint_0 already exists .*load its state first"):
        accelerator.save_state()


def test_load_state_takes_the_newest_complete_checkpoint_and_moves_the_iteration_past_it(tmp_path, caplog):
    accelerator, model = build(tmp_path)
    saved = []
    for value in (1.0, 2.0):
        with torch.no_grad():
            model.weight.fill_(value)
        saved.append(accelerator.save_state())
    # a newer folder without completion marker (an unfinished save, or another library's) is skipped
    shutil.copytree(saved[1], os.path.join(tmp_path, "checkpoints", "checkpoint_9"))
    os.remove(os.path.join(tmp_path, "checkpoints", "checkpoint_9", "hasten_checkpoint.json"))
    accelerator, model = build(tmp_path, seed=1)
    with caplog.at_level("WARNING"):
        assert accelerator.load_state() == saved[1]
    assert "Skipping" in caplog.text and "checkpoint_9" in caplog.text
    assert torch.all(model.weight == 2.0)
    assert accelerator.save_iteration == 2
    assert os.path.basename(accelerator.save_state()) == "checkpoint_2"


def test_no_complete_checkpoint_is_an_error_naming_the_folders(tmp_path):
    accelerator, model = build(tmp_path)
    with pytest.raises(CheckpointNotFoundError, match="there are none"):
        accelerator.load_state()
    os.makedirs(tmp_path / "checkpoints" / "checkpoint_0")
    with pytest.raises(CheckpointNotFoundError, match=r"checkpoint_0\) have no completion marker"):
        accelerator.load_state()


def test_automatic_naming_needs_a_project_dir():
    AcceleratorState._reset_state(True)
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(automatic_checkpoint_naming=True))
    with pytest.raises(ValueError, match="needs a project folder"):
        accelerator.save_state()


def test_auto_resume_does_nothing_on_a_fresh_start_then_continues_from_the_newest(tmp_path):
    accelerator, model = build(tmp_path)
    assert latest_checkpoint(accelerator) is None
    assert auto_resume(accelerator) is None
    with torch.no_grad():
        model.weight.fill_(3.0)
    folder = accelerator.save_state()
    accelerator, model = build(tmp_path, seed=5)
    assert latest_checkpoint(accelerator) == folder
    assert auto_resume(accelerator) == folder
    assert torch.all(model.weight == 3.0) and accelerator.save_iteration == 1


def test_auto_resume_without_automatic_naming_needs_a_folder(tmp_path):
    AcceleratorState._reset_state(True)
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="automatic_checkpoint_naming=True"):
        auto_resume(accelerator)
    assert auto_resume(accelerator, checkpoints_dir=tmp_path) is None


def test_leftovers_of_killed_saves_are_removed_by_the_next_save(tmp_path):
    accelerator, model = build(tmp_path)
    accelerator.save_state()
    for leftover in (".checkpoint_1.incomplete", ".checkpoint_0.deleting"):
        os.makedirs(tmp_path / "checkpoints" / leftover)
        (tmp_path / "checkpoints" / leftover / "model.safetensors").write_bytes(b"partial")
    assert accelerator.load_state().endswith("checkpoint_0")  # leftovers are never picked
    accelerator.save_state()
    assert listing(tmp_path) == ["checkpoint_0", "checkpoint_1"]
