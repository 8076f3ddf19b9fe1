"""Helpers for testing code that uses hasten (Accelerate's ``accelerate.test_utils``, same names).

``testing`` has the skip decorators (``require_cuda``, ``require_multi_device``, ``slow`` ...), the launch and
subprocess helpers (``get_launch_command``, ``execute_subprocess_async``) and the machine's device
(``torch_device``, ``device_count``); ``training`` has ``RegressionDataset`` / ``RegressionModel``;
``scripts`` holds the script ``hasten test`` launches and the self-checks Accelerate's test suites launch
(``test_script``, ``test_ops``, ``test_sync``; importable from here by those names, loaded on first use);
``examples`` checks that complete example scripts hold every feature script's additions. See
docs/testing-helpers.md.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from .testing import (
    DEFAULT_LAUNCH_COMMAND,
    are_the_same_tensors,
    assert_exception,
    capture_call_output,
    device_count,
    execute_subprocess_async,
    get_launch_command,
    get_torch_dist_unique_port,
    memory_allocated_func,
    path_in_accelerate_package,
    path_in_hasten_package,
    pytest_xdist_worker_id,
    require_bnb,
    require_cpu,
    require_cuda,
    require_cuda_or_hpu,
    require_cuda_or_xpu,
    require_fp8,
    require_fp16,
    require_huggingface_suite,
    require_mlu,
    require_mps,
    require_multi_device,
    require_multi_gpu,
    require_multi_gpu_or_xpu,
    require_multi_xpu,
    require_musa,
    require_non_cpu,
    require_non_hpu,
    require_non_torch_xla,
    require_non_xpu,
    require_npu,
    require_pippy,
    require_sdaa,
    require_single_device,
    require_single_gpu,
    require_single_xpu,
    require_torch_min_version,
    require_torchao,
    require_torchvision,
    require_tpu,
    require_transformer_engine,
    require_transformer_engine_mxfp8,
    require_xpu,
    run_first,
    skip,
    slow,
    torch_device,
)
from .training import RegressionDataset, RegressionModel

__all__ = [
    "DEFAULT_LAUNCH_COMMAND", "are_the_same_tensors", "assert_exception", "capture_call_output", "device_count",
    "execute_subprocess_async", "get_launch_command", "get_torch_dist_unique_port", "memory_allocated_func",
    "path_in_accelerate_package", "path_in_hasten_package", "pytest_xdist_worker_id", "require_bnb", "require_cpu",
    "require_cuda", "require_cuda_or_hpu", "require_cuda_or_xpu", "require_fp8", "require_fp16",
    "require_huggingface_suite", "require_mlu", "require_mps", "require_multi_device", "require_multi_gpu",
    "require_multi_gpu_or_xpu", "require_multi_xpu", "require_musa", "require_non_cpu", "require_non_hpu",
    "require_non_torch_xla", "require_non_xpu", "require_npu", "require_pippy", "require_sdaa",
    "require_single_device", "require_single_gpu", "require_single_xpu", "require_torch_min_version",
    "require_torchao", "require_torchvision", "require_tpu", "require_transformer_engine",
    "require_transformer_engine_mxfp8", "require_xpu", "run_first", "skip", "slow", "torch_device",
    "RegressionDataset", "RegressionModel", "sanity_script_path", "test_ops", "test_script", "test_sync",
]

_SCRIPTS = ("test_ops", "test_script", "test_sync")


def __getattr__(name: str):
    """``from hasten.test_utils import test_script`` loads the packaged script module then (it imports the
    Accelerator, which importing the helpers alone should not)."""
    if name in _SCRIPTS:
        return importlib.import_module(f"{__name__}.scripts.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def sanity_script_path() -> Path:
    """The script ``hasten test`` launches: process state, a gather, a broadcast and a barrier."""
    return path_in_hasten_package("test_utils", "scripts", "sanity_check.py")
