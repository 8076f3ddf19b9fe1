"""One DCP save and one DCP load across a sharded checkpoint's folders (checkpointing/dcp_folders.py): each folder
written that way is what a save of its state alone writes, so plain DCP (and the reference library) reads it alone;
folders written one by one read back in one load."""
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException

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



def test_tensors_of_the_same_layout_are_read_straight_into_their_destination(tmp_path, monkeypatch):
    """Each stored tensor whose destination has its shape, dtype and contiguous layout is read into it directly
    (only its header is unpickled, on the meta device); any other goes DCP's way; the values are the same."""
    from hasten.checkpointing.safe_dcp import SafeFileSystemReader

    torch.manual_seed(0)
    saved = {"m": {"w": torch.randn(64, 32), "h": torch.randn(16, 8).bfloat16(), "t": torch.randn(8, 16).t(),
                   "s": torch.tensor(3.0), "e": torch.empty(0), "n": 7}}
    dcp.save(saved, checkpoint_id=str(tmp_path))
    whole_loads = []
    real_load = torch.load

    def counting_load(*args, **kwargs):
        if kwargs.get("map_location") != "meta":
            whole_loads.append(kwargs.get("map_location"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    target = zeros_like(saved)
    target["m"]["t"] = torch.zeros(8, 16).t()  # the stored layout is not contiguous: read DCP's way
    dcp.load(target, storage_reader=SafeFileSystemReader(str(tmp_path)), planner=SafeLoadPlanner())
    assert_equal(target, saved)
    assert whole_loads.count("cpu") == 1  # "t" only; "n" is a value (weights_only bytes)
    data = next(path for path in tmp_path.iterdir() if path.suffix == ".distcp")
    data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])  # the pieces past the middle lose their end
    with pytest.raises(CheckpointException):
        dcp.load(zeros_like(saved), storage_reader=SafeFileSystemReader(str(tmp_path)), planner=SafeLoadPlanner())


def test_a_stored_tensors_place_is_found_only_for_a_plain_tensor_and_nothing_named_is_built(tmp_path):
    import io
    import zipfile

    from hasten.checkpointing.stored_tensor import stored_tensor

    def archive(value) -> io.BytesIO:
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return buffer

    whole = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    buffer = archive(whole)
    found = stored_tensor(buffer, 0, len(buffer.getvalue()))
    assert (found.dtype, found.shape, found.contiguous, found.nbytes) == (torch.bfloat16, (3, 4), True, 24)
    assert buffer.getvalue()[found.data_offset:found.data_offset + 24] == whole.view(torch.uint8).numpy().tobytes()
    base = torch.arange(12.0)
    for other in (base[2:], {"a": whole}, whole.t().contiguous().t()):  # a view into more storage, a dict, a transpose
        buffer = archive(other)
        found = stored_tensor(buffer, 0, len(buffer.getvalue()))
        assert found is None or not found.contiguous
    marker = tmp_path / "ran"
    crafted = io.BytesIO()
    with zipfile.ZipFile(crafted, "w") as entries:  # a header that names code instead of a tensor
        entries.writestr("archive/data.pkl", b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
        entries.writestr("archive/data/0", b"\0" * 8)
    assert stored_tensor(crafted, 0, len(crafted.getvalue())) is None and not marker.exists()


def test_save_plans_are_kept_for_the_next_save_of_the_same_layout_and_another_dtype_is_planned_again(
        tmp_path, monkeypatch):
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import SavePlanner

    from hasten.checkpointing import sharded_io

    if sharded_io.cached_plans_planner(states()) is None:
        pytest.skip("this PyTorch's DCP has no save-plan caching")
    for cache in ("_cached_all_plans", "_cached_global_plan", "_cached_metadata", "_cached_save_plan",
                  "_cached_final_save_plan"):  # another test in this process may have saved this layout
        monkeypatch.setattr(SavePlanner, cache, {})
    planned = []
    original = DefaultSavePlanner._create_global_plan
    monkeypatch.setattr(DefaultSavePlanner, "_create_global_plan",
                        lambda self, plans: (planned.append(self._cached_plans_key), original(self, plans))[1])
    first, second = states(), states()
    second["pytorch_model_fsdp_0"]["model"]["layer.weight"] += 1  # other values, the same layout
    halves = states()
    halves["optimizer_0"]["optimizer"]["state"]["layer.weight"]["exp_avg"] = torch.ones(6, 4, dtype=torch.bfloat16)
    for name, saved in (("first", first), ("second", second), ("halves", halves)):
        sharded_io.save_folders(saved, tmp_path / name)
    assert len(planned) == 2 and planned[0] != planned[1]  # the second save reused the first one's plans
    for name, saved in (("second", second), ("halves", halves)):  # each holds its own values and dtypes
        with open(tmp_path / name / "optimizer_0" / ".metadata", "rb") as handle:
            stored = pickle.load(handle).state_dict_metadata["optimizer.state.layer.weight.exp_avg"]
        assert stored.properties.dtype == saved["optimizer_0"]["optimizer"]["state"]["layer.weight"]["exp_avg"].dtype
        loaded = zeros_like(saved)
        dcp.load(loaded, storage_reader=dcp_folders.FolderSetReader(str(tmp_path / name), list(saved)),
                 planner=SafeLoadPlanner())
        assert_equal(loaded, saved)
