"""One DCP save and one DCP load across a sharded checkpoint's folders (checkpointing/dcp_folders.py): each folder
written that way is what a save of its state alone writes, so plain DCP (and the reference library) reads it alone;
folders written one by one read back in one load."""
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from hasten.checkpointing import dcp_folders
from hasten.checkpointing.safe_dcp import SafeLoadPlanner, UnsafeCheckpointError

pytestmark = pytest.mark.skipif(not dcp_folders.available(), reason="this PyTorch's DCP writer lacks the internals")


def states():
    torch.manual_seed(0)
    model = {"layer.weight": torch.randn(6, 4), "layer.bias": torch.randn(6)}
    optimizer = {"state": {"layer.weight": {"exp_avg": torch.randn(6, 4), "step": torch.tensor(3.0)}},
                 "param_groups": [{"lr": 0.01, "params": ["layer.weight", "layer.bias"]}]}
    return {"pytorch_model_fsdp_0": {"model": model}, "optimizer_0": {"optimizer": optimizer}}


def zeros_like(state):
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        return {key: zeros_like(value) for key, value in state.items()}
    if isinstance(state, list):
        return [zeros_like(value) for value in state]
    return state


def assert_equal(found, expected):
    if isinstance(expected, torch.Tensor):
        assert torch.equal(found, expected)
    elif isinstance(expected, dict):
        assert found.keys() == expected.keys()
        for key in expected:
            assert_equal(found[key], expected[key])
    elif isinstance(expected, list):
        assert len(found) == len(expected)
        for a, b in zip(found, expected):
            assert_equal(a, b)
    else:
        assert found == expected


def test_each_folder_written_together_loads_alone_with_plain_dcp_and_names_only_its_own_state(tmp_path):
    saved = states()
    dcp.save(saved, storage_writer=dcp_folders.FolderSetWriter(str(tmp_path), list(saved)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["optimizer_0", "pytorch_model_fsdp_0"]
    for folder, state in saved.items():
        with open(tmp_path / folder / ".metadata", "rb") as handle:
            metadata = pickle.load(handle)
        top = next(iter(state))
        assert all(name.startswith(top + ".") for name in metadata.state_dict_metadata)
        assert all("/" not in info.relative_path and (tmp_path / folder / info.relative_path).is_file()
                   for info in metadata.storage_data.values())
        loaded = zeros_like(state)
        dcp.load(loaded, storage_reader=FileSystemReader(str(tmp_path / folder)))  # as the reference library does
        assert_equal(loaded, state)


def test_folders_written_one_by_one_read_back_in_one_load(tmp_path):
    saved = states()
    for folder, state in saved.items():
        dcp.save(state, checkpoint_id=str(tmp_path / folder))
    loaded = zeros_like(saved)
    dcp.load(loaded, storage_reader=dcp_folders.FolderSetReader(str(tmp_path), list(saved)),
             planner=SafeLoadPlanner())
    assert_equal(loaded, saved)


def test_the_reader_refuses_a_folder_whose_metadata_names_other_objects(tmp_path):
    saved = states()
    dcp.save(saved, storage_writer=dcp_folders.FolderSetWriter(str(tmp_path), list(saved)))
    with open(tmp_path / "optimizer_0" / ".metadata", "wb") as handle:
        pickle.dump({"payload": pytest.raises}, handle)  # a global beyond DCP's metadata classes
    with pytest.raises(UnsafeCheckpointError, match="optimizer_0"):
        dcp_folders.FolderSetReader(str(tmp_path), list(saved)).read_metadata()

