"""Writing a checkpoint's files side by side (parallel_writes.py), their checksums computed while written and handed
to the marker's writer (checksums.py), and the checksum check of a load dealt out between processes (atomic.py)."""
import threading
import time

import pytest
import torch

from hasten.checkpointing import checksums, parallel_writes
from hasten.checkpointing.atomic import file_shares, write_marker
from hasten.checkpointing.writers import write_pickle, write_tensors


def test_files_are_written_side_by_side_and_the_first_failure_is_raised_once_all_ended(monkeypatch):
    monkeypatch.delenv(parallel_writes.ENV_VARIABLE, raising=False)
    running, most, ended = [0], [0], []
    lock = threading.Lock()

    def write(name, fail=False):
        def run():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
                ended.append(name)
            if fail:
                raise OSError(28, f"No space left on device ({name})")
        return run

    parallel_writes.write_files([write(f"file{i}") for i in range(6)])
    assert most[0] == 4 and len(ended) == 6  # at most 4 at once, every file written

    ended.clear()
    with pytest.raises(OSError, match="file1"):  # the first failure in the order given, after every write ended
        parallel_writes.write_files([write("file0"), write("file1", True), write("file2", True), write("file3")])
    assert sorted(ended) == ["file0", "file1", "file2", "file3"]

    monkeypatch.setenv(parallel_writes.ENV_VARIABLE, "1")
    running[0] = most[0] = 0
    parallel_writes.write_files([write(f"file{i}") for i in range(3)])
    assert most[0] == 1
    monkeypatch.setenv(parallel_writes.ENV_VARIABLE, "many")
    with pytest.raises(ValueError, match="HASTEN_CHECKPOINT_WRITERS must be a whole number"):
        parallel_writes.write_files([write("file0"), write("file1")])


def test_checksums_computed_while_writing_equal_the_files_and_reach_the_marker(tmp_path):
    write_tensors({"weight": torch.randn(64, 64)}, tmp_path / "model.safetensors", checksum=True)
    write_pickle({"state": torch.randn(300)}, tmp_path / "optimizer.bin", checksum=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "shard.distcp").write_bytes(b"written by another process")
    noted = checksums.noted_under(tmp_path)
    assert noted == {name: checksums.file_checksum(tmp_path / name) for name in ("model.safetensors", "optimizer.bin")}
    assert checksums.noted_under(tmp_path) == {}  # handed over once
    from_elsewhere = {"other/shard.distcp": checksums.file_checksum(tmp_path / "other" / "shard.distcp")}
    marker = write_marker(tmp_path, {}, {**noted, **from_elsewhere})
    assert marker["checksums"] == {**noted, **from_elsewhere}


def test_a_loads_checksums_are_dealt_out_once_each_and_evenly_the_same_everywhere():
    sizes = {"optimizer_0/__0_0.distcp": 800, "optimizer_0/__1_0.distcp": 800, "pytorch_model_fsdp_0/__0_0.distcp": 400,
             "pytorch_model_fsdp_0/__1_0.distcp": 400, "random_states_0.pkl": 1, "random_states_1.pkl": 1}
    for processes in (1, 2, 3, 8):
        shares = file_shares(sizes, processes)
        assert len(shares) == processes
        assert sorted(name for share in shares for name in share) == sorted(sizes)
        assert file_shares(dict(reversed(list(sizes.items()))), processes) == shares  # the marker's order aside
    loads = [sum(sizes[name] for name in share) for share in file_shares(sizes, 2)]
    assert loads == [1201, 1201]
