"""Whether optional integrations and accelerator backends are available, and the error that says which extra
to install.

Package checks use ``importlib.util.find_spec`` plus the installed distribution's metadata, so asking never
imports the (often heavy) package and a stray folder of the same name does not count. Device checks ask torch
(``torch.cuda``, ``torch.backends.mps`` ...) without initialising a device where torch allows it; torch itself
is imported only when such a check runs, so importing this module stays cheap.
"""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Callable, TypeVar

from .env_vars import parse_flag_from_env, patch_environment
from .versions import compare_versions, is_torch_version

F = TypeVar("F", bound=Callable[..., Any])  # a decorated function, returned with its signature

# module to import -> (extra that installs it, what it is for)
EXTRAS = {
    "deepspeed": ("deepspeed", "DeepSpeed ZeRO"),
    "bitsandbytes": ("bnb", "8-bit / 4-bit quantization"),
    "torchdata": ("stateful", "stateful data loaders (torchdata's StatefulDataLoader)"),
    "megatron.core": ("megatron", "Megatron-LM tensor/pipeline parallelism"),
    "tensorboard": ("trackers", "the TensorBoard tracker"),
    "wandb": ("trackers", "the Weights & Biases tracker"),
    "mlflow": ("trackers", "the MLflow tracker"),
    "torchao": ("fp8", "fp8 training through torchao"),
    "accelerate": ("reference", "side-by-side comparisons with the reference library"),
    "ray": ("ray", "Ray Train"),
}

#: ``USE_TORCH_XLA=0`` runs a plain torch job on a host where torch_xla is installed (read once, at import).
USE_TORCH_XLA = parse_flag_from_env("USE_TORCH_XLA", default=True)


@functools.lru_cache(maxsize=None)
def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=None)
def _installed(module: str, *distributions: str) -> bool:
    """``module`` is importable and one of its ``distributions`` (default: the module's name) is installed."""
    if not _found(module):
        return False
    for distribution in distributions or (module,):
        try:
            importlib.metadata.metadata(distribution)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def _version_at_least(distribution: str, minimum: str) -> bool:
    try:
        return compare_versions(distribution, ">=", minimum)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False


def _torch():
    import torch

    return torch


# ----------------------------------------------------------------------------- torch and its backends
def is_torch_distributed_available() -> bool:
    return _torch().distributed.is_available()


def is_xccl_available() -> bool:
    """Whether torch was built with Intel's XCCL collective backend (torch >= 2.7)."""
    torch = _torch()
    if not is_torch_version(">=", "2.7.0") or not torch.distributed.is_available():
        return False
    check = getattr(torch.distributed.distributed_c10d, "is_xccl_available", None)
    return bool(check()) if check is not None else False


def is_cuda_available() -> bool:
    """Whether a CUDA device is usable, asked through NVML so that CUDA itself is not initialised (which would
    break forking worker processes afterwards)."""
    with patch_environment(PYTORCH_NVML_BASED_CUDA_CHECK="1"):
        return _torch().cuda.is_available()


def is_rocm_available() -> bool:
    torch = _torch()
    return torch.version.hip is not None and torch.cuda.is_available()


@functools.lru_cache(maxsize=None)
def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether torch_xla is installed (and, with a flag, drives a TPU or a GPU). ``USE_TORCH_XLA=0`` says no."""
    if check_is_tpu and check_is_gpu:
        raise ValueError("is_torch_xla_available: check_is_tpu and check_is_gpu cannot both be True.")
    if not USE_TORCH_XLA or not _found("torch_xla"):
        return False
    try:
        import torch_xla.core.xla_model  # noqa: F401
        import torch_xla.runtime as xr
    except ImportError:
        return False
    if check_is_gpu:
        return xr.device_type() in ("GPU", "CUDA")
    if check_is_tpu:
        return xr.device_type() == "TPU"
    return True


def is_mps_available(min_version: str = "1.12") -> bool:
    torch = _torch()
    return is_torch_version(">=", min_version) and torch.backends.mps.is_available() and torch.backends.mps.is_built()


def _vendor_device_available(module: str, attribute: str, check_device: bool) -> bool:
    """A device backend shipped as a torch plugin package (``torch_npu`` -> ``torch.npu`` ...)."""
    if not _found(module):
        return False
    try:
        importlib.import_module(module)
    except Exception:  # e.g. torch_npu installed in a CPU-only container
        return False
    backend = getattr(_torch(), attribute, None)
    if backend is None:
        return False
    if check_device:
        try:
            backend.device_count()  # raises RuntimeError when no device is present
        except RuntimeError:
            return False
    return bool(backend.is_available())


@functools.lru_cache(maxsize=None)
def is_mlu_available(check_device: bool = False) -> bool:
    if not _found("torch_mlu"):
        return False
    with patch_environment(PYTORCH_CNDEV_BASED_MLU_CHECK="1"):  # asks the driver without initialising the device
        return _vendor_device_available("torch_mlu", "mlu", check_device)


@functools.lru_cache(maxsize=None)
def is_musa_available(check_device: bool = False) -> bool:
    return _vendor_device_available("torch_musa", "musa", check_device)


@functools.lru_cache(maxsize=None)
def is_npu_available(check_device: bool = False) -> bool:
    return _vendor_device_available("torch_npu", "npu", check_device)


@functools.lru_cache(maxsize=None)
def is_sdaa_available(check_device: bool = False) -> bool:
    return _vendor_device_available("torch_sdaa", "sdaa", check_device)


@functools.lru_cache(maxsize=None)
def is_neuron_available(check_device: bool = False) -> bool:
    return _vendor_device_available("torch_neuronx", "neuron", check_device)


@functools.lru_cache(maxsize=None)
def is_hpu_available(init_hccl: bool = False) -> bool:
    """Whether Intel Gaudi (HPU) is usable through ``habana_frameworks.torch``."""
    if not _found("habana_frameworks") or not _found("habana_frameworks.torch"):
        return False
    import habana_frameworks.torch  # noqa: F401

    if init_hccl:
        import habana_frameworks.torch.distributed.hccl  # noqa: F401
    torch = _torch()
    return hasattr(torch, "hpu") and torch.hpu.is_available()


def is_habana_gaudi1() -> bool:
    """Whether the HPU is a first-generation Gaudi (which has no fp16)."""
    if not is_hpu_available():
        return False
    import habana_frameworks.torch.utils.experimental as htexp

    return htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi


@functools.lru_cache(maxsize=None)
def is_xpu_available(check_device: bool = False) -> bool:
    """Whether an Intel XPU is usable through stock torch (torch >= 2.7)."""
    if is_torch_version("<=", "2.6"):
        return False
    torch = _torch()
    if check_device:
        try:
            torch.xpu.device_count()
        except RuntimeError:
            return False
        return torch.xpu.is_available()
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def is_pippy_available() -> bool:
    """Whether pipeline parallelism (``torch.distributed.pipelining``) is available: torch >= 2.4."""
    return is_torch_version(">=", "2.4.0")


def is_weights_only_available() -> bool:
    """Whether ``torch.load(weights_only=True)`` takes an allow-list of safe globals: torch >= 2.4."""
    return is_torch_version(">=", "2.4.0")


# ----------------------------------------------------------------------------- numeric formats
def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Whether bf16 can be used on this machine's accelerator (or the CPU, which always can)."""
    torch = _torch()
    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    if is_cuda_available():
        return torch.cuda.is_bf16_supported()
    if is_mlu_available():
        return torch.mlu.is_bf16_supported()
    if is_xpu_available():
        return torch.xpu.is_bf16_supported()
    if is_mps_available():
        return torch.backends.mps.is_macos_or_newer(14, 0)
    return True


def is_fp16_available() -> bool:
    """Whether fp16 can be used (everywhere but first-generation Gaudi)."""
    return not is_habana_gaudi1()


def is_fp8_available() -> bool:
    """Whether a library that trains in fp8 is installed (MS-AMP, Transformer Engine or torchao)."""
    return is_msamp_available() or is_transformer_engine_available() or is_torchao_available()


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    return _version_at_least("numpy", min_version)


# ----------------------------------------------------------------------------- optional packages
def is_deepspeed_available() -> bool:
    return _installed("deepspeed")


def is_bnb_available(min_version: str | None = None) -> bool:
    if not _installed("bitsandbytes"):
        return False
    return min_version is None or _version_at_least("bitsandbytes", min_version)


def is_4bit_bnb_available() -> bool:
    return is_bnb_available("0.39.0")


def is_8bit_bnb_available() -> bool:
    return is_bnb_available("0.37.2")


def is_bitsandbytes_multi_backend_available() -> bool:
    if not is_bnb_available():
        return False
    import bitsandbytes

    return "multi_backend" in getattr(bitsandbytes, "features", set())


def is_torchdata_available() -> bool:
    return _installed("torchdata")


def is_torchdata_stateful_dataloader_available() -> bool:
    return _found("torchdata") and _found("torchdata.stateful_dataloader")


def is_megatron_lm_available() -> bool:
    return _found("megatron") and _found("megatron.core")


def is_torchao_available() -> bool:
    return _installed("torchao") and _version_at_least("torchao", "0.6.1")


def is_msamp_available() -> bool:
    return _installed("msamp", "ms-amp")


def is_transformer_engine_available() -> bool:
    if is_hpu_available():
        return _installed("intel_transformer_engine", "intel-transformer-engine")
    return _installed("transformer_engine", "transformer-engine")


def is_transformer_engine_mxfp8_available() -> bool:
    """Whether Transformer Engine is installed and the GPU supports its MXFP8 recipe."""
    if not _installed("transformer_engine", "transformer-engine"):
        return False
    from transformer_engine.pytorch.fp8 import check_mxfp8_support

    return bool(check_mxfp8_support()[0])


def is_schedulefree_available() -> bool:
    return _installed("schedulefree")


def is_lomo_available() -> bool:
    return _installed("lomo_optim")


def is_import_timer_available() -> bool:
    return _installed("import_timer")


def is_pynvml_available() -> bool:
    return _installed("pynvml", "pynvml", "nvidia-ml-py")


def is_amdsmi_available() -> bool:
    return _installed("amdsmi")


def is_pytest_available() -> bool:
    return _installed("pytest")


def is_torchvision_available() -> bool:
    return _installed("torchvision")


def is_transformers_available() -> bool:
    return _installed("transformers")


def is_datasets_available() -> bool:
    return _installed("datasets")


def is_peft_available() -> bool:
    return _installed("peft")


def is_timm_available() -> bool:
    return _installed("timm")


def is_triton_available() -> bool:
    if is_xpu_available():
        return _installed("triton", "triton-xpu")
    return _installed("triton")


def is_tqdm_available() -> bool:
    return _installed("tqdm")


def is_pandas_available() -> bool:
    return _installed("pandas")


def is_matplotlib_available() -> bool:
    return _installed("matplotlib")


def is_boto3_available() -> bool:
    return _installed("boto3")


def is_sagemaker_available() -> bool:
    return _installed("sagemaker")


def is_rich_available() -> bool:
    """Whether ``rich`` is installed and asked for (``HASTEN_ENABLE_RICH=1`` or ``ACCELERATE_ENABLE_RICH=1``)."""
    if not _installed("rich"):
        return False
    from .env_aliases import get_flag_setting

    return get_flag_setting("enable_rich", False)


# trackers
def is_tensorboard_available() -> bool:
    return _installed("tensorboard") or _installed("tensorboardX")


def is_wandb_available() -> bool:
    return _installed("wandb")


def is_mlflow_available() -> bool:
    return _installed("mlflow", "mlflow", "mlflow-skinny")


def is_comet_ml_available() -> bool:
    return _installed("comet_ml")


def is_aim_available() -> bool:
    """Whether ``aim`` is installed in a version the tracker supports (< 4)."""
    return _installed("aim") and not _version_at_least("aim", "4.0.0")


def is_clearml_available() -> bool:
    return _installed("clearml")


def is_dvclive_available() -> bool:
    return _installed("dvclive")


def is_swanlab_available() -> bool:
    return _installed("swanlab")


def is_trackio_available() -> bool:
    return sys.version_info >= (3, 10) and _installed("trackio")


# ----------------------------------------------------------------------------- guards
def torchao_required(func: F) -> F:
    """Decorator: ``func`` raises ImportError (saying how to install torchao) unless torchao is available."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if not is_torchao_available():
            raise ImportError(f"{func.__qualname__} needs torchao >= 0.6.1, which is not installed: pip install torchao")
        return func(*args, **kwargs)

    return wrapper


def require_extra(module: str, feature: str | None = None) -> ModuleType:
    """Import and return ``module``, or raise ImportError naming the pip command that installs it."""
    if _found(module.split(".")[0]) and _found(module):
        return importlib.import_module(module)
    parts = module.split(".")
    prefixes = (".".join(parts[:i]) for i in range(len(parts), 0, -1))  # the longest known prefix names the extra
    extra, purpose = next((EXTRAS[p] for p in prefixes if p in EXTRAS), (None, module))
    how = f"pip install 'hasten[{extra}]'" if extra else f"pip install {module.split('.')[0]}"
    raise ImportError(f"{feature or purpose} needs the `{module}` package, which is not installed: {how}")


def require_deepspeed() -> ModuleType:
    """Import deepspeed (on a CPU-only run, on its CPU accelerator); a clear error when it is not installed."""
    if importlib.util.find_spec("deepspeed") is None:
        raise ImportError("DeepSpeed is not installed: pip install 'hasten[deepspeed]' (the deepspeed package).")
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    return deepspeed
