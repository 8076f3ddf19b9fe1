"""Helpers for testing code that uses hasten: skip decorators, launching, subprocesses (Accelerate's
``accelerate.test_utils.testing``, same names and signatures).

Every ``require_*`` decorator is a ``unittest.skipUnless`` on a check made when the decorator is applied
(at import of the test module), so it works with both unittest and pytest. The checks are hasten's own
(``hasten.utils``): asking never imports a heavy optional package, and never initialises CUDA.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path
from typing import Optional, Union
from unittest import mock

import torch

from ..core import imports as _imports
from ..core.env_vars import str_to_bool
from ..core.versions import compare_versions, is_torch_version

__all__ = [
    "get_backend", "torch_device", "device_count", "memory_allocated_func", "get_launch_command",
    "DEFAULT_LAUNCH_COMMAND", "parse_flag_from_env", "skip", "slow", "run_first",
    "require_cpu", "require_non_cpu", "require_cuda", "require_cuda_or_hpu", "require_xpu", "require_cuda_or_xpu",
    "require_non_xpu", "require_non_hpu", "require_fp16", "require_fp8", "require_fsdp2", "require_peft",
    "require_mlu", "require_sdaa", "require_musa", "require_npu", "require_neuron", "require_mps",
    "require_huggingface_suite", "require_datasets", "require_transformers", "require_timm", "require_torchvision",
    "require_triton", "require_schedulefree", "require_bnb", "require_tpu", "require_non_torch_xla",
    "require_single_device", "require_single_gpu", "require_single_xpu", "require_multi_device",
    "require_multi_gpu", "require_multi_xpu", "require_multi_gpu_or_xpu", "require_deepspeed", "require_tp",
    "require_torch_min_version", "require_tensorboard", "require_wandb", "require_trackio", "require_comet_ml",
    "require_aim", "require_clearml", "require_dvclive", "require_swanlab", "require_pandas", "require_mlflow",
    "require_pippy", "require_import_timer", "require_transformer_engine", "require_transformer_engine_mxfp8",
    "require_torchao", "require_matplotlib", "require_trackers", "require_torchdata_stateful_dataloader",
    "TempDirTestCase", "AccelerateTestCase", "HastenTestCase", "MockingTestCase", "are_the_same_tensors",
    "execute_subprocess_async", "pytest_xdist_worker_id", "get_torch_dist_unique_port", "SubprocessCallException",
    "run_command", "path_in_accelerate_package", "path_in_hasten_package", "assert_exception",
    "capture_call_output",
]


# ---------------------------------------------------------------- availability checks


def _check(name: str, *args, **kwargs) -> bool:
    """hasten's own availability check ``hasten.utils.<name>``."""
    return bool(getattr(importlib.import_module("hasten.utils"), name)(*args, **kwargs))


def _package(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _cuda() -> bool:
    return _imports.is_cuda_available()


def _torch_xla(check_is_tpu: bool = False) -> bool:
    return _imports.is_torch_xla_available(check_is_tpu=check_is_tpu)


def _mps() -> bool:
    return _imports.is_mps_available()


def _xpu() -> bool:
    return _imports.is_xpu_available()


def _hpu() -> bool:
    return _imports.is_hpu_available()


def _habana_gaudi1() -> bool:
    return _imports.is_habana_gaudi1()


def _plugin_device(device: str) -> bool:
    return _check(f"is_{device}_available")


def _device_count(device: str) -> int:
    backend = getattr(torch, device, None)
    try:
        return int(backend.device_count()) if backend is not None else 0
    except Exception:
        return 0


def _fp8_libraries() -> bool:
    return _imports.is_fp8_available()


def _cuda_fp8_capability() -> bool:
    """Whether the current CUDA GPU computes in fp8 (compute capability 8.9: Ada, Hopper and newer)."""
    return _check("check_cuda_fp8_capability")


def _transformer_engine() -> bool:
    return _imports.is_transformer_engine_available()


def _transformer_engine_mxfp8() -> bool:
    return _imports.is_transformer_engine_mxfp8_available()


def _version_at_least(package: str, version: str) -> bool:
    if not _package(package):
        return False
    try:
        return compare_versions(package, ">=", version)
    except Exception:  # installed as a folder without metadata
        return False


# ---------------------------------------------------------------- the machine's device


def get_backend():
    """``(device type, number of devices, function returning the bytes allocated on the current device)``.

    The device type is the accelerator torch would use here (``"cuda"``, ``"xpu"``, ``"mps"``, ``"npu"`` ...),
    or ``"cpu"`` (1 device, 0 bytes) on a machine without one.
    """
    if _torch_xla():
        return "xla", torch.cuda.device_count(), torch.cuda.memory_allocated
    if _cuda():
        return "cuda", torch.cuda.device_count(), torch.cuda.memory_allocated
    if _mps():
        allocated = getattr(getattr(torch, "mps", None), "current_allocated_memory", None)
        return "mps", 1, allocated or (lambda: 0)
    for device in ("mlu", "sdaa", "musa", "npu"):
        if _plugin_device(device):
            backend = getattr(torch, device)
            return device, backend.device_count(), backend.memory_allocated
    if _xpu():
        return "xpu", torch.xpu.device_count(), torch.xpu.memory_allocated
    if _hpu():
        return "hpu", torch.hpu.device_count(), torch.hpu.memory_allocated
    if _plugin_device("neuron"):
        return "neuron", torch.neuron.device_count(), torch.neuron.memory_allocated
    return "cpu", 1, lambda: 0


torch_device, device_count, memory_allocated_func = get_backend()


# ---------------------------------------------------------------- launching


def get_launch_command(**kwargs) -> list:
    """``hasten launch`` followed by one flag per keyword argument, ready for ``subprocess``.

    ``True`` becomes a bare flag, ``None`` and ``False`` are left out, anything else becomes ``--key=value``:

    >>> get_launch_command(num_processes=2, monitor_interval=0.1, cpu=True)
    ['hasten', 'launch', '--num_processes=2', '--monitor_interval=0.1', '--cpu']

    The ``hasten`` executable must be on ``PATH``; ``execute_subprocess_async`` and ``run_command`` also find it
    next to the running Python when the environment was not activated.
    """
    command = ["hasten", "launch"]
    for key, value in kwargs.items():
        if isinstance(value, bool):
            if value:
                command.append(f"--{key}")
        elif value is not None:
            command.append(f"--{key}={value}")
    return command


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count, monitor_interval=0.1)


# ---------------------------------------------------------------- flags and plain decorators


def parse_flag_from_env(key, default=False):
    """The boolean environment variable ``key`` (``1/0``, ``yes/no``, ``true/false`` ...); ``default`` when unset."""
    value = os.environ.get(key)
    if value is None:
        return default
    try:
        return bool(str_to_bool(value))
    except ValueError:
        raise ValueError(f"If set, {key} must be yes or no (1/0, true/false, on/off), got {value!r}.") from None


_run_slow_tests = parse_flag_from_env("RUN_SLOW", default=False)


def skip(test_case):
    """Skip the test unconditionally."""
    return unittest.skip("Test was skipped")(test_case)


def slow(test_case):
    """Mark a test as slow: skipped unless the ``RUN_SLOW`` environment variable is true."""
    return unittest.skipUnless(_run_slow_tests, "test is slow (set RUN_SLOW=1 to run it)")(test_case)


def run_first(test_case):
    """Mark a test ``order(1)``: with the pytest-order plugin it runs before the others (tests that start
    subprocesses on a device only one process may hold). Without pytest the test is returned as it is."""
    if _package("pytest"):
        import pytest

        return pytest.mark.order(1)(test_case)
    return test_case


def _skip_unless(condition: bool, reason: str):
    return unittest.skipUnless(bool(condition), reason)


# ---------------------------------------------------------------- devices


def require_cpu(test_case):
    """Run only on a machine without an accelerator (skipped where a GPU or other device is available)."""
    return _skip_unless(torch_device == "cpu", "test requires only a CPU")(test_case)


def require_non_cpu(test_case):
    """Run only where a hardware accelerator is available."""
    return _skip_unless(torch_device != "cpu", "test requires a GPU")(test_case)


def require_cuda(test_case):
    """Run only where CUDA is available (and not through torch_xla)."""
    return _skip_unless(_cuda() and not _torch_xla(), "test requires a GPU")(test_case)


def require_cuda_or_hpu(test_case):
    """Run only where CUDA (not through torch_xla) or an HPU is available."""
    return _skip_unless((_cuda() and not _torch_xla()) or _hpu(), "test requires a GPU or HPU")(test_case)


def require_xpu(test_case):
    """Run only where an Intel XPU is available."""
    return _skip_unless(_xpu(), "test requires a XPU")(test_case)


def require_cuda_or_xpu(test_case):
    """Run only where CUDA (not through torch_xla) or an XPU is available."""
    return _skip_unless((_cuda() and not _torch_xla()) or _xpu(), "test requires a CUDA GPU or XPU")(test_case)


def require_non_xpu(test_case):
    """Skip on XPU machines."""
    return _skip_unless(torch_device != "xpu", "test requires a non-XPU")(test_case)


def require_non_hpu(test_case):
    """Skip on HPU machines."""
    return _skip_unless(torch_device != "hpu", "test requires a non-HPU")(test_case)


def require_mlu(test_case):
    """Run only where a Cambricon MLU is available."""
    return _skip_unless(_plugin_device("mlu"), "test require a MLU")(test_case)


def require_sdaa(test_case):
    """Run only where an SDAA device is available."""
    return _skip_unless(_plugin_device("sdaa"), "test require a SDAA")(test_case)


def require_musa(test_case):
    """Run only where a Moore Threads MUSA device is available."""
    return _skip_unless(_plugin_device("musa"), "test require a MUSA")(test_case)


def require_npu(test_case):
    """Run only where an Ascend NPU is available."""
    return _skip_unless(_plugin_device("npu"), "test require a NPU")(test_case)


def require_neuron(test_case):
    """Run only where AWS Neuron cores are available."""
    return _skip_unless(_plugin_device("neuron"), "test require Neuron Cores")(test_case)


def require_mps(test_case):
    """Run only where torch supports Apple's ``mps`` backend."""
    return _skip_unless(_mps(), "test requires a `mps` backend support in `torch`")(test_case)


def require_tpu(test_case):
    """Run only on TPUs (through torch_xla)."""
    return _skip_unless(_torch_xla(check_is_tpu=True), "test requires TPU")(test_case)


def require_non_torch_xla(test_case):
    """Skip where torch_xla is available."""
    return _skip_unless(not _torch_xla(), "test requires an env without TorchXLA")(test_case)


def require_single_device(test_case):
    """Run only with exactly one accelerator (skipped on CPU-only machines and with several devices)."""
    return _skip_unless(torch_device != "cpu" and device_count == 1,
                        "test requires a single device accelerator")(test_case)


def require_single_gpu(test_case):
    """Run only with exactly one CUDA GPU."""
    return _skip_unless(_device_count("cuda") == 1, "test requires a GPU")(test_case)


def require_single_xpu(test_case):
    """Run only with exactly one XPU."""
    return _skip_unless(_device_count("xpu") == 1, "test requires a XPU")(test_case)


def require_multi_device(test_case):
    """Run only with more than one accelerator."""
    return _skip_unless(device_count > 1, "test requires multiple hardware accelerators")(test_case)


def require_multi_gpu(test_case):
    """Run only with more than one CUDA GPU."""
    return _skip_unless(_device_count("cuda") > 1, "test requires multiple GPUs")(test_case)


def require_multi_xpu(test_case):
    """Run only with more than one XPU."""
    return _skip_unless(_device_count("xpu") > 1, "test requires multiple XPUs")(test_case)


def require_multi_gpu_or_xpu(test_case):
    """Run only with more than one CUDA GPU or XPU."""
    return _skip_unless((_cuda() or _xpu()) and device_count > 1, "test requires multiple GPUs or XPUs")(test_case)


# ---------------------------------------------------------------- numerics


def require_fp16(test_case):
    """Run only where fp16 is supported (everywhere but Gaudi 1)."""
    available = _check("is_fp16_available")
    return _skip_unless(available, "test requires FP16 support")(test_case)


def require_fp8(test_case):
    """Run only where fp8 training works: an fp8 library (torchao, Transformer Engine, MS-AMP) is installed and,
    on CUDA, the GPU computes in fp8 (compute capability 8.9 or newer); never on Gaudi 1."""
    available = _fp8_libraries()
    if available and torch.cuda.is_available() and not _cuda_fp8_capability():
        available = False
    if available and _habana_gaudi1():
        available = False
    return _skip_unless(available, "test requires FP8 support")(test_case)


# ---------------------------------------------------------------- torch features


def require_fsdp2(test_case):
    """Run only with torch >= 2.5 (``fully_shard``)."""
    return _skip_unless(is_torch_version(">=", "2.5.0"), "test requires FSDP2 (torch >= 2.5.0)")(test_case)


def require_torch_min_version(test_case=None, version=None):
    """Run only with torch >= ``version``: ``@require_torch_min_version(version="2.4.0")``."""
    if test_case is None:
        return functools.partial(require_torch_min_version, version=version)
    if version is None:
        raise ValueError("require_torch_min_version needs version=..., e.g. @require_torch_min_version(version='2.4').")
    return _skip_unless(is_torch_version(">=", version), f"test requires torch version >= {version}")(test_case)


def require_pippy(test_case):
    """Run only where pipeline parallelism is possible (torch >= 2.4, not Gaudi 1)."""
    available = _check("is_pippy_available")
    return _skip_unless(available and not _habana_gaudi1(), "test requires pippy")(test_case)


def require_tp(test_case):
    """Run only where tensor parallelism is possible (torch >= 2.3 and transformers >= 4.52)."""
    available = is_torch_version(">=", "2.3.0") and _version_at_least("transformers", "4.52.0")
    return _skip_unless(available, "test requires torch version >= 2.3.0 and transformers version >= 4.52.0")(
        test_case)


def require_torchdata_stateful_dataloader(test_case):
    """Run only where torchdata's ``StatefulDataLoader`` is installed."""
    available = _check("is_torchdata_stateful_dataloader_available")
    return _skip_unless(available, "test requires torchdata.stateful_dataloader")(test_case)


# ---------------------------------------------------------------- optional packages


def _require_package(check: str, reason: str):
    def decorator(test_case):
        return _skip_unless(_check(check), reason)(test_case)

    return decorator


def require_peft(test_case):
    """Run only where PEFT is installed."""
    return _require_package("is_peft_available", "test requires PEFT")(test_case)


def require_datasets(test_case):
    """Run only where 🤗 Datasets is installed."""
    return _require_package("is_datasets_available", "test requires the datasets library")(test_case)


def require_transformers(test_case):
    """Run only where 🤗 Transformers is installed."""
    return _require_package("is_transformers_available", "test requires the transformers library")(test_case)


def require_huggingface_suite(test_case):
    """Run only where both Transformers and Datasets are installed."""
    available = (_check("is_transformers_available")
                 and _check("is_datasets_available"))
    return _skip_unless(available, "test requires the Hugging Face suite")(test_case)


def require_timm(test_case):
    """Run only where timm is installed."""
    return _require_package("is_timm_available", "test requires the timm library")(test_case)


def require_torchvision(test_case):
    """Run only where torchvision is installed."""
    return _require_package("is_torchvision_available", "test requires the torchvision library")(test_case)


def require_triton(test_case):
    """Run only where triton is installed."""
    return _require_package("is_triton_available", "test requires the triton library")(test_case)


def require_schedulefree(test_case):
    """Run only where schedulefree is installed."""
    return _require_package("is_schedulefree_available", "test requires the schedulefree library")(test_case)


def require_bnb(test_case):
    """Run only where bitsandbytes is installed."""
    return _require_package("is_bnb_available", "test requires the bitsandbytes library")(test_case)


def require_deepspeed(test_case):
    """Run only where DeepSpeed is installed."""
    return _require_package("is_deepspeed_available", "test requires DeepSpeed")(test_case)


def require_tensorboard(test_case):
    """Run only where TensorBoard is installed."""
    return _require_package("is_tensorboard_available", "test requires Tensorboard")(test_case)


def require_wandb(test_case):
    """Run only where wandb is installed."""
    return _require_package("is_wandb_available", "test requires wandb")(test_case)


def require_trackio(test_case):
    """Run only where trackio is installed."""
    return _require_package("is_trackio_available", "test requires trackio")(test_case)


def require_comet_ml(test_case):
    """Run only where comet_ml is installed."""
    return _require_package("is_comet_ml_available", "test requires comet_ml")(test_case)


def require_aim(test_case):
    """Run only where aim is installed."""
    return _require_package("is_aim_available", "test requires aim")(test_case)


def require_clearml(test_case):
    """Run only where clearml is installed."""
    return _require_package("is_clearml_available", "test requires clearml")(test_case)


def require_dvclive(test_case):
    """Run only where dvclive is installed."""
    return _require_package("is_dvclive_available", "test requires dvclive")(test_case)


def require_swanlab(test_case):
    """Run only where swanlab is installed."""
    return _require_package("is_swanlab_available", "test requires swanlab")(test_case)


def require_pandas(test_case):
    """Run only where pandas is installed."""
    return _require_package("is_pandas_available", "test requires pandas")(test_case)


def require_mlflow(test_case):
    """Run only where MLflow is installed."""
    return _require_package("is_mlflow_available", "test requires mlflow")(test_case)


def require_import_timer(test_case):
    """Run only where the import_timer (tuna) package is installed."""
    return _require_package("is_import_timer_available", "test requires tuna interpreter")(test_case)


def require_transformer_engine(test_case):
    """Run only where NVIDIA Transformer Engine (Intel's on HPU) is installed."""
    return _skip_unless(_transformer_engine(), "test requires transformers engine")(test_case)


def require_transformer_engine_mxfp8(test_case):
    """Run only where Transformer Engine supports MXFP8 block scaling on this GPU."""
    return _skip_unless(_transformer_engine_mxfp8(),
                        "test requires transformers engine MXFP8 block scaling")(test_case)


def require_torchao(test_case):
    """Run only where torchao is installed."""
    return _require_package("is_torchao_available", "test requires torchao")(test_case)


def require_matplotlib(test_case):
    """Run only where matplotlib is installed."""
    return _require_package("is_matplotlib_available", "test requires matplotlib")(test_case)


_atleast_one_tracker_available = (
    any(_check(name) for name in (
        "is_wandb_available", "is_tensorboard_available", "is_trackio_available", "is_swanlab_available"))
    and not _check("is_comet_ml_available")
)


def require_trackers(test_case):
    """Run only where at least one tracker (wandb, TensorBoard, trackio, swanlab) is installed and comet_ml
    is not (comet_ml patches the others when imported)."""
    return _skip_unless(_atleast_one_tracker_available,
                        "test requires at least one tracker to be available and for `comet_ml` to not be installed",
                        )(test_case)


# ---------------------------------------------------------------- test case classes


class TempDirTestCase(unittest.TestCase):
    """A TestCase with one temporary folder, ``self.tmpdir`` (a ``Path``), for the whole class.

    The folder is emptied before each test (unless ``clear_on_setup`` is False) and removed after the class.
    """

    clear_on_setup = True

    @classmethod
    def setUpClass(cls):
        cls.tmpdir = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls):
        if os.path.exists(cls.tmpdir):
            shutil.rmtree(cls.tmpdir)

    def setUp(self):
        if self.clear_on_setup:
            for path in list(self.tmpdir.iterdir()):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()


class AccelerateTestCase(unittest.TestCase):
    """A TestCase that resets the shared process, accelerator and gradient state after every test, so that
    one test's ``Accelerator`` never leaks into the next."""

    def tearDown(self):
        super().tearDown()
        from ..state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()


HastenTestCase = AccelerateTestCase  # hasten's name for it


class MockingTestCase(unittest.TestCase):
    """A TestCase that starts mocks in ``setUp`` and stops them after each test.

    Call ``self.add_mocks(...)`` at the end of ``setUp``, after ``super().setUp()``::

        def setUp(self):
            super().setUp()
            self.add_mocks(mock.patch.dict(os.environ, {"SOME_ENV_VAR": "SOME_VALUE"}))
    """

    def add_mocks(self, mocks: Union[mock.Mock, list[mock.Mock]]):
        """Start ``mocks`` (one mock or a list) now and stop them when the test ends."""
        self.mocks = list(mocks) if isinstance(mocks, (tuple, list)) else [mocks]
        for one in self.mocks:
            one.start()
            self.addCleanup(one.stop)


# ---------------------------------------------------------------- distributed checks


def are_the_same_tensors(tensor):
    """Whether ``tensor`` has the same value on every process (a gather; every process must call it)."""
    from ..collectives.operations import gather
    from ..state import PartialState

    state = PartialState()
    local = tensor[None].clone().to(state.device)
    everyone = gather(local).cpu()
    mine = local[0].cpu()
    return all(torch.equal(everyone[i], mine) for i in range(everyone.shape[0]))


# ---------------------------------------------------------------- subprocesses


class _RunOutput:
    """What ``execute_subprocess_async`` returns: the exit code and the output, as lists of lines."""

    def __init__(self, returncode, stdout, stderr):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    def __repr__(self) -> str:
        return (f"_RunOutput(returncode={self.returncode}, {len(self.stdout)} stdout lines, "
                f"{len(self.stderr)} stderr lines)")


def _as_argv(cmd, env) -> list[str]:
    """``cmd`` as strings; a bare program name not found on ``PATH`` is looked up next to the running Python
    (``hasten`` in a virtual environment that was not activated)."""
    argv = [os.fspath(part) if isinstance(part, os.PathLike) else str(part) for part in cmd]
    if argv and os.sep not in argv[0]:
        search_path = (env if env is not None else os.environ).get("PATH")
        if shutil.which(argv[0], path=search_path) is None:
            beside = Path(sys.executable).parent / argv[0]
            if beside.is_file() and os.access(beside, os.X_OK):
                argv[0] = str(beside)
    return argv


def _tail(lines: list[str], limit: int = 500) -> str:
    shown = lines[-limit:]
    skipped = f"[... {len(lines) - limit} earlier lines ...]\n" if len(lines) > limit else ""
    return skipped + "\n".join(shown)


def execute_subprocess_async(cmd: list, env=None, stdin=None, timeout=180, quiet=False, echo=True) -> _RunOutput:
    """Run ``cmd``, stream its output as it comes (prefixed ``stdout:`` / ``stderr:``, unless ``quiet``) and
    return a ``_RunOutput`` whose ``stdout`` and ``stderr`` are lists of lines.

    A non-zero exit (a signal included) raises ``RuntimeError`` with the command, the exit code and the
    captured stdout and stderr. ``timeout`` (seconds, ``None`` for none) is enforced: the process is killed
    and ``RuntimeError`` says so. ``echo`` prints the command first. ``env`` replaces the environment,
    ``stdin`` is passed to ``subprocess.Popen``. Threads read the pipes, so this works inside a running event
    loop (a notebook) too.
    """
    argv = _as_argv(cmd, env)
    command_text = " ".join(argv)
    if echo:
        print("\nRunning: ", command_text)
    process = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out: list[str] = []
    err: list[str] = []

    def pump(stream, sink, target, label):
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip()
            sink.append(line)
            if not quiet:
                print(label, line, file=target, flush=True)
        stream.close()

    readers = [threading.Thread(target=pump, args=(process.stdout, out, sys.stdout, "stdout:"), daemon=True),
               threading.Thread(target=pump, args=(process.stderr, err, sys.stderr, "stderr:"), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        for reader in readers:
            reader.join(timeout=5)
        raise RuntimeError(
            f"'{command_text}' did not finish within {timeout} seconds and was killed.\n\n"
            f"stdout:\n{_tail(out)}\n\nstderr:\n{_tail(err)}"
        ) from None
    for reader in readers:
        reader.join()
    if returncode != 0:
        how = f"was killed by signal {-returncode}" if returncode < 0 else f"failed with returncode {returncode}"
        raise RuntimeError(
            f"'{command_text}' {how}\n\nThe combined stderr from workers follows:\n{_tail(err)}\n\n"
            f"stdout:\n{_tail(out)}"
        )
    return _RunOutput(returncode, out, err)


class SubprocessCallException(Exception):
    """``run_command``'s command failed; the message holds its output."""


def run_command(command: list[str], return_stdout=False, env=None):
    """Run ``command`` to completion (stderr merged into stdout); return the output as text with
    ``return_stdout``. A failure raises ``SubprocessCallException`` with the command and its output."""
    argv = _as_argv(command, env)
    try:
        output = subprocess.check_output(argv, stderr=subprocess.STDOUT, env=env)
    except subprocess.CalledProcessError as error:
        raise SubprocessCallException(
            f"Command `{' '.join(argv)}` failed with the following error:\n\n"
            f"{error.output.decode('utf-8', errors='replace')}"
        ) from error
    if return_stdout:
        return output.decode("utf-8", errors="replace")
    return None


def pytest_xdist_worker_id():
    """The number of this pytest-xdist worker (``gw3`` -> 3); 0 without xdist or with ``-n 1``."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = re.sub(r"^gw", "", worker)
    return int(digits) if digits.isdigit() else 0


def get_torch_dist_unique_port():
    """A ``--main_process_port`` for a launched test: 29500 plus the xdist worker number, so tests running in
    parallel xdist workers never share a port."""
    return 29500 + pytest_xdist_worker_id()


# ---------------------------------------------------------------- small helpers


def path_in_hasten_package(*components: str) -> Path:
    """The path of a file or folder inside the installed ``hasten`` package."""
    return Path(__file__).resolve().parent.parent.joinpath(*components)


def path_in_accelerate_package(*components: str) -> Path:
    """Accelerate's name for ``path_in_hasten_package``: a path inside the installed ``hasten`` package."""
    return path_in_hasten_package(*components)


@contextlib.contextmanager
def assert_exception(exception_class: Exception, msg: Optional[str] = None) -> bool:
    """Assert that the block raises ``exception_class`` (a subclass counts) whose message contains ``msg``.

    A block that raises nothing, or raises another kind of exception, fails with ``AssertionError``.
    """
    try:
        yield
    except Exception as error:  # noqa: BLE001 - any exception is checked against the expected one
        if not isinstance(error, exception_class):
            message = f"Expected exception of type {exception_class} but got {type(error)}: {error}"
            raise AssertionError(message) from error
        if msg is not None and msg not in str(error):
            raise AssertionError(f"Expected message '{msg}' to be in exception but got '{error}'") from error
        return
    raise AssertionError(f"Expected exception of type {exception_class} but ran without issue.")


def capture_call_output(func, *args, **kwargs):
    """Call ``func(*args, **kwargs)`` and return what it printed to stdout (exceptions propagate)."""
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        func(*args, **kwargs)
    return captured.getvalue()


# Names Accelerate's testing module has in its namespace and test files import from it: the availability checks
# and the state classes, answered from where hasten keeps them (loaded on first use).
_FROM_UTILS = ("check_cuda_fp8_capability", "is_habana_gaudi1", "gather")
_FROM_STATE = ("AcceleratorState", "GradientState")


def __getattr__(name: str):
    if name in _FROM_STATE:
        return getattr(importlib.import_module("hasten.state"), name)
    if name in _FROM_UTILS or (name.startswith("is_") and name.endswith("_available")):
        utils = importlib.import_module("hasten.utils")
        if hasattr(utils, name):
            return getattr(utils, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
