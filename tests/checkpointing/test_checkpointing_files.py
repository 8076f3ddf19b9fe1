"""The pieces under save_state: file names, the safetensors writer, random states, matching saved keys to a model."""
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from hasten.checkpointing import layout
from hasten.checkpointing.formats import is_checkpoint_file
from hasten.checkpointing.full_files import FullStateFormat
from hasten.checkpointing.sharded_files import ShardedFormat
from hasten.checkpointing.weights import drop_aliases, fill_aliases, match_keys
from hasten.checkpointing.rng import capture_rng_states, restore_rng_states
from hasten.checkpointing.writers import SAFETENSORS_DTYPES, write_safetensors


def test_file_names_are_the_reference_library_s():
    full = FullStateFormat
    assert [full.model_file(i) for i in range(3)] == ["model.safetensors", "model_1.safetensors",
                                                      "model_2.safetensors"]
    assert [full.model_file(i, safe_serialization=False) for i in range(2)] == ["pytorch_model.bin",
                                                                                "pytorch_model_1.bin"]
    assert [full.optimizer_file(i) for i in range(2)] == ["optimizer.bin", "optimizer_1.bin"]
    assert [full.scheduler_file(i) for i in range(2)] == ["scheduler.bin", "scheduler_1.bin"]
    assert full.SCALER_NAME == "scaler.pt"
    assert layout.rng_file(3) == "random_states_3.pkl"
    assert full.custom_object_file(2) == "custom_checkpoint_2.pkl"
    assert is_checkpoint_file("dl_state_dict_1.bin") and is_checkpoint_file("sampler.bin")
    assert not is_checkpoint_file("notes.txt") and not is_checkpoint_file("model.json")


def test_the_folder_scan_knows_every_format_s_names_and_nothing_else():
    # every format's names, as each format spells them, and the folder's own
    for name in (FullStateFormat.model_file(2, False), FullStateFormat.custom_object_file(0),
                 ShardedFormat.model_folder(1), ShardedFormat.optimizer_folder(0), ShardedFormat.gathered_model_file(1),
                 "pytorch_model", "pytorch_model_1", "latest", layout.rng_file(0), layout.loader_states_file(3),
                 layout.MARKER_NAME, layout.process_record_file(2)):
        assert is_checkpoint_file(name), name
    for name in ("pytorch_model_fsdp", "optimizer", "notes.md", "random_states.pkl", "checkpoint_1", "model_x.bin"):
        assert not is_checkpoint_file(name), name


def test_reference_constants_agree():
    constants = pytest.importorskip("accelerate.utils.constants")
    full = FullStateFormat
    assert full.model_file(0) == constants.SAFE_WEIGHTS_NAME and full.model_file(0, False) == constants.WEIGHTS_NAME
    assert full.optimizer_file(0) == f"{constants.OPTIMIZER_NAME}.bin"
    assert full.scheduler_file(0) == f"{constants.SCHEDULER_NAME}.bin"
    assert full.SCALER_NAME == constants.SCALER_NAME and layout.RNG_STATE_NAME == constants.RNG_STATE_NAME
    assert ShardedFormat.model_folder(0) == f"{constants.FSDP_MODEL_NAME}_0"


def sample(dtype, shape=(3, 5)):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape).to(dtype)
    return torch.randint(0, 100, shape).to(dtype)


def as_bytes(tensor):
    """Bit-exact comparison, NaN and -0.0 included."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def test_the_writer_produces_files_safetensors_reads_back_exactly(tmp_path):
    tensors = {str(dtype): sample(dtype) for dtype in SAFETENSORS_DTYPES}
    tensors.update(scalar=torch.tensor(2.5), empty=torch.empty(0, 3), column=torch.randn(6, 6)[:, 2],
                   transposed=torch.randn(3, 4).t())
    write_safetensors(tensors, tmp_path / "ours.safetensors")
    loaded = load_file(tmp_path / "ours.safetensors")
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape
        assert torch.equal(as_bytes(loaded[name]), as_bytes(tensor)), name
    # same content as the library's own writer
    reference = {k: v.contiguous() for k, v in tensors.items()}
    save_file(reference, tmp_path / "theirs.safetensors")
    theirs = load_file(tmp_path / "theirs.safetensors")
    assert all(torch.equal(as_bytes(theirs[k]), as_bytes(loaded[k])) for k in theirs)


def test_the_writer_refuses_what_safetensors_cannot_hold(tmp_path):
    with pytest.raises(TypeError, match="sparse"):
        write_safetensors({"s": torch.eye(2).to_sparse()}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="meta device"):
        write_safetensors({"m": torch.empty(2, device="meta")}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="hold tensors only"):
        write_safetensors({"n": 3}, tmp_path / "x.safetensors")


def test_random_states_come_back_for_every_generator():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    states = capture_rng_states(step=7)
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(10)
    np.random.seed(20)
    torch.manual_seed(30)
    restore_rng_states(states)
    assert (random.random(), np.random.rand()) == expected[:2] and torch.equal(torch.rand(3), expected[2])
    assert states["step"] == 7
    with pytest.raises(ValueError, match="torch_manual_seed"):
        restore_rng_states({"random_state": random.getstate(), "numpy_random_seed": np.random.get_state()})


def test_saved_keys_are_matched_to_the_model_whatever_wrapper_wrote_them():
    expected = ["0.weight", "0.bias", "module.x"]  # a user submodule really called "module" stays
    value = torch.zeros(1)
    assert match_keys({"module.0.weight": value, "module.0.bias": value, "module.module.x": value}, expected).keys() \
        == set(expected)
    assert match_keys({"_orig_mod.0.weight": value, "0.bias": value}, expected).keys() == {"0.weight", "0.bias"}
    unrelated = {"encoder.weight": value}
    assert match_keys(unrelated, expected) == unrelated  # left for load_state_dict to report


def test_tied_weights_are_dropped_on_save_and_filled_on_load():
    model = nn.Module()
    model.a = nn.Linear(2, 2, bias=False)
    model.b = nn.Linear(2, 2, bias=False)
    model.b.weight = model.a.weight
    model.c = nn.Linear(2, 2, bias=False)
    state = model.state_dict(keep_vars=True)
    kept, aliases = drop_aliases(state)
    assert list(kept) == ["a.weight", "c.weight"] and aliases == {"b.weight": "a.weight"}
    filled = fill_aliases({"a.weight": torch.ones(2, 2), "c.weight": torch.zeros(2, 2)}, state)
    assert set(filled) == {"a.weight", "b.weight", "c.weight"} and filled["b.weight"] is filled["a.weight"]
    halves = torch.arange(4.0)
    assert drop_aliases({"x": halves[:2], "y": halves[2:]})[1] == {}  # views of one storage are not aliases


def test_durable_files_hold_exactly_what_was_written(tmp_path, monkeypatch):
    from hasten.checkpointing import writers

    synced = []
    real = writers.os.fsync if not hasattr(writers.os, "fdatasync") else writers.os.fdatasync
    monkeypatch.setattr(writers.os, "fdatasync" if hasattr(writers.os, "fdatasync") else "fsync",
                        lambda fd: (synced.append(fd), real(fd)))
    chunks = [bytes([i]) * 1000 for i in range(50)]
    with writers.DurableFile(tmp_path / "f", sync_every=4096) as handle:
        for chunk in chunks:
            assert handle.write(chunk) == 1000
    assert (tmp_path / "f").read_bytes() == b"".join(chunks)
    assert synced  # flushed in the background while being written

    state = {"w": torch.randn(300, 300), "step": 3, "nested": [torch.arange(5)]}
    writers.write_pickle(state, tmp_path / "p.bin")
    loaded = torch.load(tmp_path / "p.bin", weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 3 and torch.equal(loaded["nested"][0],
                                                                                         state["nested"][0])
    config = torch.utils.serialization.config.save
    assert config.compute_crc32 is True  # switched off only while hasten writes


def test_a_failed_background_flush_fails_the_write(tmp_path, monkeypatch):
    from hasten.checkpointing import writers

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(writers.os, "fdatasync" if hasattr(writers.os, "fdatasync") else "fsync", broken)
    handle = writers.DurableFile(tmp_path / "f", sync_every=10)
    handle.write(b"x" * 100)
    with pytest.raises(OSError, match="Input/output error"):
        handle.close()
