"""Checkpoints that are verified, load all-or-nothing, and resume past a damaged newest checkpoint:
checksums in the marker, every file read and checked before anything is applied, fallback to the previous
checkpoint, one writer per folder (lock file), clear errors for a full disk and truncated files."""
import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.checkpointing import CheckpointError, CorruptCheckpointError, UnsafeCheckpointError, auto_resume
from hasten.checkpointing import checksums, writers
from hasten.checkpointing.errors import CheckpointWriteError
from hasten.checkpointing.atomic import LOCK_NAME
from hasten.state import AcceleratorState, GradientState
from hasten.utils import ProjectConfiguration

pytestmark = pytest.mark.filterwarnings("ignore:fp16 mixed precision on the CPU")


class Holder:
    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


class Evil:
    """Unpickling this runs a shell command: a checkpoint file holding it must be refused."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


def build(project_dir=None, total_limit=None, safe_serialization=True):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch.manual_seed(0)
    config = (ProjectConfiguration(project_dir=str(project_dir), automatic_checkpoint_naming=True,
                                   total_limit=total_limit) if project_dir is not None else None)
    accelerator = Accelerator(cpu=True, mixed_precision="fp16", project_config=config)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 3))
    parts = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4), scheduler)
    holder = Holder({"value": 0})
    accelerator.register_for_checkpointing(holder)
    return accelerator, holder, parts


def train(accelerator, holder, parts, steps=1):
    model, optimizer, loader, scheduler = parts
    iterator = iter(loader)
    for _ in range(steps):
        x, y = next(iterator)
        accelerator.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    accelerator.scaler.update(accelerator.scaler.get_scale() * 2)
    holder.state["value"] += 1


def observe(accelerator, holder, parts):
    """Everything a load could change, copied."""
    model, optimizer, loader, scheduler = parts
    generator = torch.get_rng_state().clone()
    return {
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()},
        "scheduler": scheduler.state_dict()["last_epoch"],
        "scaler": accelerator.scaler.get_scale(),
        "loader": repr(loader.state_dict()) if hasattr(loader, "state_dict") else None,
        "custom": dict(holder.state), "rng": generator, "step": accelerator._accumulator.step,
    }


def same(a, b):
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            assert x.keys() == y.keys(), key
            assert all(torch.equal(x[k], y[k]) if torch.is_tensor(x[k]) else x[k] == y[k] for k in x), key
        elif torch.is_tensor(x):
            assert torch.equal(x, y), key
        else:
            assert x == y, key
    return True


def flip(path):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(255 - b for b in data[middle:middle + 64])
    path.write_bytes(bytes(data))


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def malicious(path):
    torch.save({"state": Evil()}, path)


KINDS = ["model.safetensors", "optimizer.bin", "scheduler.bin", "scaler.pt", "random_states_0.pkl",
         "loader_states_0.bin", "custom_checkpoint_0.pkl"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hardening")
    accelerator, holder, parts = build()
    train(accelerator, holder, parts)
    accelerator.save_state(root / "safe")
    accelerator.save_state(root / "pickled", safe_serialization=False)
    return root


@pytest.mark.parametrize("damage", [flip, truncate, malicious])
def test_every_damaged_file_is_refused_and_nothing_changes(saved, tmp_path, damage):
    accelerator, holder, parts = build()
    train(accelerator, holder, parts, steps=2)
    train(accelerator, holder, parts, steps=1)
    before = observe(accelerator, holder, parts)
    for name in KINDS + ["pytorch_model.bin"]:
        source = saved / ("pickled" if name == "pytorch_model.bin" else "safe")
        for with_marker in (True, False):
            if damage is flip and not with_marker:
                continue  # without the marker's checksum a flipped byte in tensor data is undetectable
            folder = tmp_path / f"{name}_{with_marker}"
            shutil.copytree(source, folder)
            if not with_marker:  # as the reference library writes it: no marker, the files are parsed
                os.remove(folder / "hasten_checkpoint.json")
            damage(folder / name)
            expected = UnsafeCheckpointError if damage is malicious and not with_marker \
                and name != "model.safetensors" else CheckpointError
            with pytest.raises(expected, match=name.replace(".", "[.]")):
                accelerator.load_state(folder)
            assert same(before, observe(accelerator, holder, parts)), (name, with_marker)
    accelerator.load_state(saved / "safe")  # the intact checkpoint does load, and changes the state
    assert not torch.equal(before["weights"]["weight"], parts[0].weight)


def test_marker_records_a_checksum_per_file_and_zlib_fallback_reads_it(saved, tmp_path, monkeypatch):
    marker = json.loads((saved / "safe" / "hasten_checkpoint.json").read_text())
    assert set(marker["checksums"]) == set(marker["files"])
    monkeypatch.setattr(checksums, "_ALGORITHMS", {"crc32": checksums._ALGORITHMS["crc32"]})
    accelerator, holder, parts = build()
    folder = accelerator.save_state(tmp_path / "zlib")
    written = json.loads((tmp_path / "zlib" / "hasten_checkpoint.json").read_text())
    assert all(value.startswith("crc32:") for value in written["checksums"].values())
    flip(tmp_path / "zlib" / "optimizer.bin")
    with pytest.raises(CorruptCheckpointError, match="optimizer[.]bin.*checksum"):
        accelerator.load_state(folder)
    monkeypatch.setenv("HASTEN_CHECKPOINT_CHECKSUMS", "0")  # the documented opt-out: sizes only, then parsing
    with pytest.raises(CorruptCheckpointError) as refused:
        accelerator.load_state(folder)
    assert "was saved)" not in str(refused.value)  # a parse error, not the checksum comparison


def test_a_failure_while_applying_puts_back_what_was_applied(saved):
    accelerator, holder, parts = build()
    train(accelerator, holder, parts, steps=3)
    before = observe(accelerator, holder, parts)

    def refuse(state):
        raise ValueError("this object refuses its state")

    holder.load_state_dict = refuse  # applied after optimizers, schedulers and scaler, before the model
    with pytest.raises(ValueError, match="refuses"):
        accelerator.load_state(saved / "safe")
    assert same(before, observe(accelerator, holder, parts))


def test_model_that_does_not_fit_is_refused_before_anything_changes(saved):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(4, 5)  # other shape
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(Holder({"value": 0}))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match="size mismatch for weight"):
        accelerator.load_state(saved / "safe", strict=False)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    accelerator, holder, parts = build(tmp_path)
    train(accelerator, holder, parts)
    first = accelerator.save_state()
    good = observe(accelerator, holder, parts)
    train(accelerator, holder, parts)
    newest = accelerator.save_state()
    flip(tmp_path / "checkpoints" / "checkpoint_1" / "optimizer.bin")

    accelerator, holder, parts = build(tmp_path)
    with caplog.at_level("WARNING"):
        assert accelerator.load_state() == first
    assert "checkpoint_1 is damaged" in caplog.text and "optimizer.bin" in caplog.text
    assert same({k: good[k] for k in ("weights", "optimizer", "custom")}, observe(accelerator, holder, parts))
    assert accelerator.save_state().endswith("checkpoint_2")  # the damaged folder's name is not reused
    os.remove(tmp_path / "checkpoints" / "checkpoint_2" / "scheduler.bin")  # now checkpoint_2 is damaged

    accelerator, holder, parts = build(tmp_path)
    assert auto_resume(accelerator) == first
    with pytest.raises(CorruptCheckpointError, match="optimizer[.]bin"):  # named explicitly: still raises
        accelerator.load_state(newest)


def test_a_second_job_saving_to_the_same_folder_is_stopped_by_the_lock(tmp_path):
    accelerator, holder, parts = build()
    accelerator.save_state(tmp_path / "ckpt")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        staging = tmp_path / ".ckpt.incomplete"
        staging.mkdir()
        (staging / "model.safetensors").write_bytes(b"half written by the other job")
        (staging / LOCK_NAME).write_text(json.dumps({"pid": other.pid, "host": os.uname().nodename,
                                                     "since": 0}))
        with pytest.raises(CheckpointError, match=f"another job [(]process {other.pid} on host"):
            accelerator.save_state(tmp_path / "ckpt")
        assert (staging / "model.safetensors").is_file()  # the other job's files are left alone
    finally:
        other.kill()
        other.wait()
    accelerator.save_state(tmp_path / "ckpt")  # its process is gone: a stale lock, taken over
    assert not staging.exists() and not (tmp_path / "ckpt" / LOCK_NAME).exists()
    accelerator.load_state(tmp_path / "ckpt")


def test_a_full_disk_names_the_file_and_the_room_total_limit_needs(tmp_path, monkeypatch):
    accelerator, holder, parts = build(tmp_path, total_limit=2)
    first = accelerator.save_state()
    original = writers.DurableFile._put

    def full(self, view):
        if self._file.name.endswith("optimizer.bin"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, view)

    monkeypatch.setattr(writers.DurableFile, "_put", full)
    with pytest.raises(CheckpointWriteError, match=r"optimizer[.]bin .*the disk is full.*total_limit=2.*3 checkpoints"):
        accelerator.save_state()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_0"]  # no staging folder, no lock left
    monkeypatch.setattr(writers.DurableFile, "_put", original)
    assert accelerator.save_state().endswith("checkpoint_1")
    accelerator.load_state(first)


def test_a_truncated_pickled_file_of_a_reference_folder_is_named(saved, tmp_path):
    accelerator, holder, parts = build()
    for name in ("pytorch_model.bin", "optimizer.bin"):
        folder = tmp_path / name
        shutil.copytree(saved / "pickled", folder)
        os.remove(folder / "hasten_checkpoint.json")
        with open(folder / name, "r+b") as handle:
            handle.truncate(100)
        with pytest.raises(CorruptCheckpointError, match=f"Cannot read {name.replace('.', '[.]')} .*damaged"):
            accelerator.load_state(folder)


def test_two_processes_agree_to_fall_back_and_refuse_together_and_folders_per_process_merge(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from helpers import run_launch

    result = run_launch("check_checkpoint_hardening.py", tmp_path, num_processes=2, timeout=180)
    assert result.stdout.count("HARDENING OK") == 2, result.stdout
    assert result.stdout.count("PROCESS FOLDERS OK") == 2, result.stdout + result.stderr[-3000:]


def test_the_clean_up_leaves_the_folders_of_the_save_in_progress_and_a_lock_survives_a_clean_up(tmp_path, monkeypatch):
    from hasten.checkpointing.atomic import SaveLock
    from hasten.checkpointing.rotation import remove_stale_staging

    claimed = tmp_path / ".checkpoint_2.process_1.incomplete"  # process 1, between its mkdir and its lock file
    killed = tmp_path / ".checkpoint_1.process_1.incomplete"  # left by a killed save, no lock
    for folder in (claimed, killed):
        folder.mkdir()
    remove_stale_staging(tmp_path, saving="checkpoint_2")
    assert claimed.is_dir() and not killed.exists()

    opened = os.open
    lock = SaveLock(tmp_path / "checkpoint_3", tmp_path / ".checkpoint_3.incomplete")

    def removed_once_created(path, *args, **kwargs):  # a clean-up that read "no lock" just before the lock was made
        descriptor = opened(path, *args, **kwargs)
        if str(path) == str(lock.path) and not removed:
            removed.append(path)
            shutil.rmtree(lock.staging)
        return descriptor

    removed = []
    monkeypatch.setattr(os, "open", removed_once_created)
    lock.acquire()
    assert removed and lock.held and json.loads(lock.path.read_text())["pid"] == os.getpid()
