"""Pinning a process to the CPU cores of its NUMA node (the node its GPU is attached to).

Memory traffic between a GPU and the CPU cores of another socket is slower; pinning each process to its
GPU's node avoids that. Everything comes from Linux sysfs (no vendor tool or library needed):

* ``/sys/devices/system/node/node<N>/cpulist`` — the cores of each NUMA node;
* ``/sys/bus/pci/devices/<domain:bus:device.0>/numa_node`` — the node of a GPU, found from the PCI address
  that ``torch.cuda.get_device_properties`` reports.

Without a GPU (or when its node is unknown) local processes are spread over the nodes round-robin:
local process ``i`` goes to the ``i % number_of_nodes``-th node.

Where there is no NUMA information (not Linux, no sysfs nodes) ``set_numa_affinity`` warns once and does
nothing — it is an optimisation and must not stop a run — while ``override_numa_affinity``, an explicit
request, raises ``NumaUnavailableError``.
"""
from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from typing import Optional

import torch

from .env_aliases import get_flag_setting

__all__ = ["set_numa_affinity", "override_numa_affinity", "NumaUnavailableError", "parse_cpu_list"]

logger = logging.getLogger("hasten.utils.environment")  # the name Accelerate logs these under (as_accelerate/logger_names.py)

# Root of the sysfs tree; tests point it at a fake tree.
SYSFS_ROOT = Path("/sys")

# local_process_index -> the cores set_numa_affinity chose (None: nothing could be done).
_applied: dict = {}


class NumaUnavailableError(RuntimeError):
    """This machine gives no NUMA information, or the affinity could not be set."""


def parse_cpu_list(text: str) -> list:
    """Parse a sysfs CPU list such as ``"0-3,8,10-11"`` into ``[0, 1, 2, 3, 8, 10, 11]``."""
    cpus = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise ValueError(f"Cannot read the CPU list {text!r}: {part!r} is not 'N' or 'N-M'.")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        cpus.extend(range(first, last + 1))
    return cpus


def _numa_nodes(root: Path) -> dict:
    """``{node number: [cpu, ...]}`` for every node that has CPUs (memory-only nodes are skipped)."""
    nodes = {}
    base = root / "devices" / "system" / "node"
    if not base.is_dir():
        return nodes
    for entry in base.iterdir():
        match = re.fullmatch(r"node(\d+)", entry.name)
        cpulist = entry / "cpulist"
        if match and cpulist.is_file():
            cpus = parse_cpu_list(cpulist.read_text())
            if cpus:
                nodes[int(match.group(1))] = cpus
    return nodes


def _gpu_numa_node(local_process_index: int, root: Path) -> Optional[int]:
    """The NUMA node of this process's GPU, or None when there is no GPU or sysfs does not say."""
    if not torch.cuda.is_available() or local_process_index >= torch.cuda.device_count():
        return None
    properties = torch.cuda.get_device_properties(local_process_index)
    try:
        address = f"{properties.pci_domain_id:04x}:{properties.pci_bus_id:02x}:{properties.pci_device_id:02x}.0"
    except AttributeError:  # an old torch without PCI information
        return None
    numa_file = root / "bus" / "pci" / "devices" / address / "numa_node"
    try:
        node = int(numa_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _check_index(local_process_index) -> int:
    if isinstance(local_process_index, bool) or not isinstance(local_process_index, int) or local_process_index < 0:
        raise ValueError(f"local_process_index must be a non-negative int, got {local_process_index!r}.")
    return local_process_index


def _choose_cpus(local_process_index: int, root: Path) -> tuple:
    """``(node, cpus)`` for the process; ``NumaUnavailableError`` when the machine says nothing about NUMA."""
    if not hasattr(os, "sched_setaffinity"):
        raise NumaUnavailableError("Setting CPU affinity needs Linux (os.sched_setaffinity is not available here).")
    nodes = _numa_nodes(root)
    if not nodes:
        raise NumaUnavailableError(
            f"No NUMA nodes with CPUs found under {root / 'devices/system/node'}; cannot choose CPU cores."
        )
    node = _gpu_numa_node(local_process_index, root)
    if node not in nodes:
        ordered = sorted(nodes)
        node = ordered[local_process_index % len(ordered)]
    return node, nodes[node]


def override_numa_affinity(local_process_index: int, verbose: Optional[bool] = None) -> list:
    """Pin this process to the cores of the NUMA node of local process ``local_process_index``; always applies.

    Returns the list of cores. ``verbose`` (default: on in debug mode, ``HASTEN_DEBUG_MODE=1``) logs the
    assignment at INFO level. Raises ``NumaUnavailableError`` when the machine has no NUMA information or the
    affinity cannot be set.
    """
    _check_index(local_process_index)
    if verbose is None:
        verbose = get_flag_setting("debug_mode")  # what is_debug_mode() says
    node, cpus = _choose_cpus(local_process_index, SYSFS_ROOT)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as error:
        raise NumaUnavailableError(
            f"Could not pin local process {local_process_index} to the cores {cpus} of NUMA node {node}: {error}. "
            "The cores may be outside this container's CPU set."
        ) from error
    if verbose:
        logger.info("Local process %d pinned to NUMA node %d, %d cores: %s", local_process_index, node,
                    len(cpus), cpus)
    return cpus


def set_numa_affinity(local_process_index: int, verbose: Optional[bool] = None) -> Optional[list]:
    """Pin this process to its NUMA node once; later calls for the same index do nothing and return the same.

    Returns the list of cores, or None (after one warning) when NUMA information is unavailable here. Use
    ``override_numa_affinity`` to recompute and apply again.
    """
    _check_index(local_process_index)
    if local_process_index in _applied:
        return _applied[local_process_index]
    try:
        cpus = override_numa_affinity(local_process_index, verbose=verbose)
    except NumaUnavailableError as error:
        warnings.warn(f"NUMA affinity not set: {error}", RuntimeWarning, stacklevel=2)
        cpus = None
    _applied[local_process_index] = cpus
    return cpus
