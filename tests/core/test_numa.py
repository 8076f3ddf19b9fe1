import logging
import os
from types import SimpleNamespace

import pytest
import torch

import hasten.core.numa as numa
from hasten.utils import override_numa_affinity, set_numa_affinity
from hasten.core.numa import NumaUnavailableError, parse_cpu_list


def fake_sysfs(root, nodes, gpus=None):
    """Write a sysfs tree: ``nodes`` = {node: "cpulist"}, ``gpus`` = {"0000:3b:00.0": numa_node}."""
    for node, cpulist in nodes.items():
        folder = root / "devices" / "system" / "node" / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpulist + "\n")
    (root / "devices" / "system" / "node" / "online").parent.mkdir(parents=True, exist_ok=True)
    (root / "devices" / "system" / "node" / "online").write_text("0-%d\n" % max(nodes, default=0))
    for address, node in (gpus or {}).items():
        folder = root / "bus" / "pci" / "devices" / address
        folder.mkdir(parents=True)
        (folder / "numa_node").write_text(f"{node}\n")
    return root


@pytest.fixture
def pinned(monkeypatch, tmp_path):
    """Point numa at a fake sysfs, record sched_setaffinity calls instead of making them, forget the cache."""
    calls = []
    monkeypatch.setattr(numa, "SYSFS_ROOT", tmp_path)
    monkeypatch.setattr(numa, "_applied", {})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: calls.append((pid, sorted(cpus))), raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return calls


def fake_gpus(monkeypatch, addresses):
    """Pretend torch sees GPUs at these PCI addresses (domain, bus, device)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(addresses))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(
        pci_domain_id=addresses[index][0], pci_bus_id=addresses[index][1], pci_device_id=addresses[index][2]))


@pytest.mark.parametrize("text, cpus", [("0-3", [0, 1, 2, 3]), ("0-1,8,10-11\n", [0, 1, 8, 10, 11]),
                                        ("5", [5]), ("", [])])
def test_parse_cpu_list(text, cpus):
    assert parse_cpu_list(text) == cpus


def test_parse_cpu_list_rejects_garbage():
    with pytest.raises(ValueError, match="not 'N' or 'N-M'"):
        parse_cpu_list("0-3,x")


def test_without_gpu_processes_are_spread_round_robin(pinned, tmp_path):
    fake_sysfs(tmp_path, {0: "0-3", 1: "4-7", 2: ""})  # node 2 has memory only
    assert override_numa_affinity(0) == [0, 1, 2, 3]
    assert override_numa_affinity(1) == [4, 5, 6, 7]
    assert override_numa_affinity(2) == [0, 1, 2, 3]
    assert pinned == [(0, [0, 1, 2, 3]), (0, [4, 5, 6, 7]), (0, [0, 1, 2, 3])]


def test_gpu_processes_go_to_their_gpus_node(pinned, tmp_path, monkeypatch):
    fake_sysfs(tmp_path, {0: "0-3,8-11", 1: "4-7,12-15"}, gpus={"0000:3b:00.0": 1, "0000:86:00.0": 0})
    fake_gpus(monkeypatch, [(0, 0x3B, 0), (0, 0x86, 0)])
    assert override_numa_affinity(0) == [4, 5, 6, 7, 12, 13, 14, 15]  # round robin would have said node 0
    assert override_numa_affinity(1) == [0, 1, 2, 3, 8, 9, 10, 11]


def test_gpu_without_a_known_node_falls_back_to_round_robin(pinned, tmp_path, monkeypatch):
    fake_sysfs(tmp_path, {0: "0-1", 1: "2-3"}, gpus={"0000:3b:00.0": -1})
    fake_gpus(monkeypatch, [(0, 0x3B, 0), (0, 0x99, 0)])  # the second GPU has no sysfs entry
    assert override_numa_affinity(0) == [0, 1]
    assert override_numa_affinity(1) == [2, 3]


def test_set_applies_once_override_always(pinned, tmp_path):
    fake_sysfs(tmp_path, {0: "0-1", 1: "2-3"})
    assert set_numa_affinity(1) == [2, 3]
    assert set_numa_affinity(1) == [2, 3]
    assert len(pinned) == 1
    override_numa_affinity(1)
    override_numa_affinity(1)
    assert len(pinned) == 3


def test_no_numa_information_set_warns_override_raises(pinned, tmp_path):
    with pytest.warns(RuntimeWarning, match="NUMA affinity not set"):
        assert set_numa_affinity(0) is None
    with pytest.raises(NumaUnavailableError, match="No NUMA nodes"):
        override_numa_affinity(0)
    assert pinned == []


def test_not_linux_set_warns_override_raises(pinned, tmp_path, monkeypatch):
    fake_sysfs(tmp_path, {0: "0-1"})
    monkeypatch.delattr(os, "sched_setaffinity")
    with pytest.warns(RuntimeWarning, match="needs Linux"):
        assert set_numa_affinity(0) is None
    with pytest.raises(NumaUnavailableError, match="needs Linux"):
        override_numa_affinity(0)


def test_affinity_refused_by_the_kernel(pinned, tmp_path, monkeypatch):
    fake_sysfs(tmp_path, {0: "64-65"})

    def refuse(pid, cpus):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    with pytest.raises(NumaUnavailableError, match="Could not pin local process 0"):
        override_numa_affinity(0)
    with pytest.warns(RuntimeWarning):
        assert set_numa_affinity(0) is None


@pytest.mark.parametrize("bad", [-1, 1.0, "0", True, None])
def test_bad_index(pinned, bad):
    with pytest.raises(ValueError, match="local_process_index"):
        override_numa_affinity(bad)
    with pytest.raises(ValueError, match="local_process_index"):
        set_numa_affinity(bad)


def test_verbose_logs_the_assignment(pinned, tmp_path, caplog, monkeypatch):
    fake_sysfs(tmp_path, {0: "0-1"})
    with caplog.at_level(logging.INFO, logger="hasten.utils.environment"):
        override_numa_affinity(0, verbose=False)
        assert caplog.records == []
        override_numa_affinity(0, verbose=True)
        assert "pinned to NUMA node 0" in caplog.text
        caplog.clear()
        override_numa_affinity(0)  # default: debug mode, off
        assert caplog.records == []
        monkeypatch.setenv("HASTEN_DEBUG_MODE", "1")
        override_numa_affinity(0)
        assert "pinned to NUMA node 0" in caplog.text


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or not os.path.isdir("/sys/devices/system/node/node0"),
                    reason="needs Linux with NUMA information in sysfs")
def test_real_machine():
    original = os.sched_getaffinity(0)
    numa._applied.pop(0, None)
    try:
        cpus = override_numa_affinity(0)
        assert cpus and os.sched_getaffinity(0) <= set(cpus)
    finally:
        os.sched_setaffinity(0, original)
