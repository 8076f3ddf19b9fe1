"""What hardware this process runs on, asked without initialising a device where possible.

GPU names, counts, the driver and compute capability come from ``nvidia-smi`` rather than ``torch.cuda``:
initialising CUDA in a launcher (or before forking workers) makes the child processes fail. The CPU
distributed information comes from the variables the common launchers set (torchrun, Intel MPI, Open MPI,
MVAPICH).
"""
from __future__ import annotations

import functools
import logging
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Optional

from . import imports
from .cluster import place_process
from .env_vars import get_int_from_env

logger = logging.getLogger(__name__)

__all__ = ["get_current_device_type", "get_gpu_info", "get_driver_version", "check_cuda_p2p_ib_support",
           "check_cuda_fp8_capability", "CPUInformation", "get_cpu_distributed_information", "check_os_kernel"]

# Consumer GPUs whose peer-to-peer / InfiniBand transfers hang with drivers older than the version given.
_P2P_BROKEN_BEFORE = {"RTX 40": "550.40.07"}


def get_current_device_type() -> tuple[str, str]:
    """``(device_type, distributed_type)`` of this machine's accelerator, e.g. ``("cuda", "MULTI_GPU")``.

    Asked without initialising any device (safe before forking). Vendor backends are checked in the order
    the process state uses (MLU, SDAA, MUSA, NPU, HPU, XPU, Neuron); otherwise CUDA is assumed.
    """
    for check, answer in ((imports.is_mlu_available, ("mlu", "MULTI_MLU")),
                          (imports.is_sdaa_available, ("sdaa", "MULTI_SDAA")),
                          (imports.is_musa_available, ("musa", "MULTI_MUSA")),
                          (imports.is_npu_available, ("npu", "MULTI_NPU")),
                          (imports.is_hpu_available, ("hpu", "MULTI_HPU")),
                          (imports.is_xpu_available, ("xpu", "MULTI_XPU")),
                          (imports.is_neuron_available, ("neuron", "MULTI_NEURON"))):
        if check():
            return answer
    return "cuda", "MULTI_GPU"


def _nvidia_smi() -> str:
    if platform.system() == "Windows" and shutil.which("nvidia-smi") is None:
        drive = os.environ.get("systemdrive", "C:")
        return f"{drive}\\Program Files\\NVIDIA Corporation\\NVSMI\\nvidia-smi.exe"
    return "nvidia-smi"


def _query(field_name: str) -> list[str]:
    """One line per GPU: ``nvidia-smi --query-gpu=<field_name>``. Raises when nvidia-smi is missing or fails."""
    output = subprocess.check_output([_nvidia_smi(), f"--query-gpu={field_name}", "--format=csv,noheader"],
                                     universal_newlines=True, timeout=60)
    return [line.strip() for line in output.strip().splitlines() if line.strip()]


def get_gpu_info() -> tuple[list[str], int]:
    """``(names, count)`` of the NVIDIA GPUs, from ``nvidia-smi`` (CUDA is not initialised).

    Raises ``FileNotFoundError`` when nvidia-smi is not installed and ``subprocess.CalledProcessError`` when
    it fails (no driver).
    """
    names = _query("name")
    return names, len(names)


def get_driver_version() -> str:
    """The NVIDIA driver version (of the first GPU), from ``nvidia-smi``."""
    return _query("driver_version")[0]


def check_cuda_p2p_ib_support() -> bool:
    """False when several GPUs of a kind whose peer-to-peer / InfiniBand transfers hang (RTX 40xx) run with a
    driver older than the fixed one; then NCCL's P2P and IB transports should be disabled. True otherwise,
    including when there are no NVIDIA GPUs or nvidia-smi cannot be asked."""
    from packaging.version import InvalidVersion, Version

    try:
        names, count = get_gpu_info()
        if count < 2:
            return True
        for model, fixed_in in _P2P_BROKEN_BEFORE.items():
            if any(model in name for name in names):
                return Version(get_driver_version()) >= Version(fixed_in)
    except (OSError, subprocess.SubprocessError, IndexError, InvalidVersion):
        pass
    return True


@functools.lru_cache(maxsize=None)
def check_cuda_fp8_capability() -> bool:
    """Whether the (first) GPU can compute in fp8: compute capability 8.9 (Ada) or newer.

    Asks nvidia-smi first; falls back to ``torch.cuda.get_device_capability()``, which initialises CUDA.
    """
    try:
        capability = tuple(int(part) for part in _query("compute_capability")[0].split("."))
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        import torch

        capability = torch.cuda.get_device_capability()
    return capability >= (8, 9)


@dataclass
class CPUInformation:
    """Where this process sits in a CPU distributed run."""

    rank: int = field(default=0, metadata={"help": "Global index of this process."})
    world_size: int = field(default=1, metadata={"help": "How many processes the job has."})
    local_rank: int = field(default=0, metadata={"help": "Index of this process on its machine."})
    local_world_size: int = field(default=1, metadata={"help": "How many processes run on this machine."})


def get_cpu_distributed_information() -> CPUInformation:
    """This process's rank, world size, local rank and local world size, from the variables of the engine that
    started it (``core/cluster.py``: torchrun's ``RANK`` ..., the MPI families', SLURM's); a single process when none
    is set."""
    place = place_process()
    if place is None:
        return CPUInformation()
    return CPUInformation(rank=place.rank, world_size=place.world_size, local_rank=place.local_rank,
                          local_world_size=place.local_world_size or 1)


#: The oldest Linux kernel known not to make distributed runs hang.
MINIMUM_LINUX_KERNEL = "5.5.0"


def _kernel_version(release: str) -> Optional[str]:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return f"{major}.{minor}.{patch or 0}"


def check_os_kernel() -> None:
    """Warn (on the main process) when the Linux kernel is older than 5.5, which can make processes hang."""
    from packaging.version import Version

    info = platform.uname()
    if info.system != "Linux":
        return
    version = _kernel_version(info.release)
    if version is None or Version(version) >= Version(MINIMUM_LINUX_KERNEL):
        return
    if get_int_from_env(["RANK"], 0) != 0:  # once per run: the main process warns
        return
    logger.warning(  # formatted here: callers (and the reference's tests) read the record's message as it is
        f"Detected kernel version {version}, which is below the recommended minimum of {MINIMUM_LINUX_KERNEL}; this "
        "can cause the process to hang. It is recommended to upgrade the kernel to the minimum version or higher.")
