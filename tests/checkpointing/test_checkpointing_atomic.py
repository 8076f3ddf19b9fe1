"""Atomic saves: a killed or failed save never damages the previous checkpoint and is never loaded; damaged or
incomplete checkpoints fail with an error naming the file."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, clean_env
from torch import nn

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpointing import (
    CheckpointError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
)
from hasten.checkpointing.atomic import (
    recover_interrupted_swap,
    replaced_folder,
    staging_folder,
)
from hasten.state import AcceleratorState, GradientState

HERE = Path(__file__).resolve().parent  # the scripts these tests launch live beside them


def build(project_dir=None, seed=0):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch.manual_seed(seed)
    config = ProjectConfiguration(project_dir=str(project_dir), automatic_checkpoint_naming=True,
                                  total_limit=1) if project_dir else None
    accelerator = Accelerator(cpu=True, project_config=config)
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


@pytest.mark.parametrize("moment", ["while_writing", "before_marker"])
def test_a_save_killed_while_writing_leaves_the_previous_checkpoint_loadable(tmp_path, moment):
    child = subprocess.Popen([sys.executable, str(HERE / "checkpoint_killed_save.py"), str(tmp_path), moment],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=ROOT)
    signal_line = "HALF WRITTEN" if moment == "while_writing" else "DATA WRITTEN"
    try:
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline and signal_line not in line:
            line = child.stdout.readline()
            if not line and child.poll() is not None:
                break
        assert signal_line in line, child.stderr.read()
        if moment == "while_writing":  # the writers ran side by side: killed with one file done, one half written
            assert "model file closed: True" in line
        else:
            assert "model.safetensors" in line and "optimizer.bin" in line
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    checkpoints = tmp_path / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == [".checkpoint_1.incomplete", "checkpoint_0"]
    partial = checkpoints / ".checkpoint_1.incomplete" / "optimizer.bin"
    assert 0 < partial.stat().st_size

    accelerator, model, optimizer = build(tmp_path, seed=3)
    assert accelerator.load_state().endswith("checkpoint_0")  # the killed save is never picked
    assert torch.all(model.weight == 1.0)
    with pytest.raises(IncompleteCheckpointError, match=r"staging folder of a save that never finished"):
        accelerator.load_state(checkpoints / ".checkpoint_1.incomplete")
    accelerator.save_state()  # checkpoint_1 again: the leftover is replaced; total_limit=1 keeps only it
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_1"]


def damaged_copy(tmp_path, damage):
    accelerator, model, optimizer = build()
    folder = tmp_path / "ckpt"
    accelerator.save_state(folder)
    damage(folder)
    return build(seed=1)[0], folder


def test_a_missing_file_is_named(tmp_path):
    accelerator, folder = damaged_copy(tmp_path, lambda f: os.remove(f / "optimizer.bin"))
    with pytest.raises(IncompleteCheckpointError, match=r"incomplete: optimizer\.bin is missing"):
        accelerator.load_state(folder)


def test_a_truncated_file_is_named(tmp_path):
    def truncate(folder):
        path = folder / "model.safetensors"
        path.write_bytes(path.read_bytes()[:-10])

    accelerator, folder = damaged_copy(tmp_path, truncate)
    with pytest.raises(CorruptCheckpointError, match=r"damaged: model\.safetensors has \d+ bytes, \d+ were saved"):
        accelerator.load_state(folder)


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.bin", "random_states_0.pkl"])
def test_a_file_overwritten_with_garbage_is_named(tmp_path, name):
    def scramble(folder):
        path = folder / name
        path.write_bytes(bytes(255 - b for b in path.read_bytes()))  # same size, unreadable

    accelerator, folder = damaged_copy(tmp_path, scramble)
    with pytest.raises(CorruptCheckpointError, match=rf"Cannot read {name.replace('.', '[.]')} .* damaged"):
        accelerator.load_state(folder)


def test_an_unreadable_marker_is_named(tmp_path):
    accelerator, folder = damaged_copy(tmp_path, lambda f: (f / "hasten_checkpoint.json").write_text("{oops"))
    with pytest.raises(CorruptCheckpointError, match=r"hasten_checkpoint\.json is not valid JSON"):
        accelerator.load_state(folder)


def test_a_folder_without_marker_is_checked_file_by_file(tmp_path):
    """Another library's checkpoint has no marker: the files this run needs must still all be there."""
    def strip(folder):
        os.remove(folder / "hasten_checkpoint.json")
        os.remove(folder / "model.safetensors")

    accelerator, folder = damaged_copy(tmp_path, strip)
    with pytest.raises(IncompleteCheckpointError, match=r"neither model\.safetensors nor pytorch_model\.bin exists"):
        accelerator.load_state(folder)


def test_a_failed_save_keeps_the_previous_checkpoint_and_leaves_nothing_behind(tmp_path):
    class Unsavable:
        def state_dict(self):
            return {"function": lambda: 1}  # cannot be pickled

        def load_state_dict(self, state):
            pass

    accelerator, model, optimizer = build()
    folder = tmp_path / "ckpt"
    accelerator.save_state(folder)
    before = sorted(os.listdir(folder))
    marker = (folder / "hasten_checkpoint.json").read_text()
    accelerator.register_for_checkpointing(Unsavable())
    with pytest.raises(Exception, match="pickle"):
        accelerator.save_state(folder)
    assert sorted(os.listdir(folder)) == before and (folder / "hasten_checkpoint.json").read_text() == marker
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # the staging folder was removed


def test_a_replacement_interrupted_before_the_new_folder_arrived_is_undone(tmp_path):
    accelerator, model, optimizer = build()
    folder = tmp_path / "ckpt"
    accelerator.save_state(folder)
    os.rename(folder, replaced_folder(folder))  # killed right after moving the old checkpoint aside
    assert accelerator.load_state(folder) == str(folder)  # put back, then loaded
    assert not replaced_folder(folder).exists()


def test_a_replacement_interrupted_after_the_new_folder_arrived_is_finished(tmp_path):
    accelerator, model, optimizer = build()
    old, new = tmp_path / "old", tmp_path / "ckpt"
    accelerator.save_state(old)
    (old / "notes.txt").write_text("keep me")
    accelerator.save_state(new)
    os.rename(old, replaced_folder(new))  # killed after the new checkpoint was renamed in
    recover_interrupted_swap(new)
    assert (new / "notes.txt").read_text() == "keep me" and not replaced_folder(new).exists()
    assert json.loads((new / "hasten_checkpoint.json").read_text())["complete"] is True


def test_staging_names_are_hidden_next_to_the_target(tmp_path):
    assert staging_folder(tmp_path / "ckpt") == tmp_path / ".ckpt.incomplete"
    assert replaced_folder(tmp_path / "ckpt") == tmp_path / ".ckpt.replaced"
    assert issubclass(IncompleteCheckpointError, CheckpointError)
