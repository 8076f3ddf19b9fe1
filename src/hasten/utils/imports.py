"""Whether optional integrations are installed, and the error that says which extra to install.

Checks use ``importlib.util.find_spec`` so that asking never imports the (often heavy) package.
"""
from __future__ import annotations

import functools
import importlib.util

# module to import -> (extra that installs it, what it is for)
EXTRAS = {
    "deepspeed": ("deepspeed", "DeepSpeed ZeRO"),
    "bitsandbytes": ("bnb", "8-bit / 4-bit quantization"),
    "torchdata": ("stateful", "stateful data loaders (torchdata's StatefulDataLoader)"),
    "megatron.core": ("megatron", "Megatron-LM tensor/pipeline parallelism"),
    "tensorboard": ("trackers", "the TensorBoard tracker"),
    "wandb": ("trackers", "the Weights & Biases tracker"),
    "mlflow": ("trackers", "the MLflow tracker"),
    "torchao": (None, "fp8 training through torchao"),
    "accelerate": ("reference", "side-by-side comparisons with the reference library"),
}


@functools.lru_cache(maxsize=None)
def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def is_deepspeed_available() -> bool:
    return _found("deepspeed")


def is_bnb_available() -> bool:
    return _found("bitsandbytes")


def is_torchdata_stateful_dataloader_available() -> bool:
    return _found("torchdata") and _found("torchdata.stateful_dataloader")


def is_megatron_lm_available() -> bool:
    return _found("megatron") and _found("megatron.core")


def is_tensorboard_available() -> bool:
    return _found("tensorboard") or _found("tensorboardX")


def is_wandb_available() -> bool:
    return _found("wandb")


def is_mlflow_available() -> bool:
    return _found("mlflow")


def is_torchao_available() -> bool:
    return _found("torchao")


def require_extra(module: str, feature: str | None = None):
    """Import and return ``module``, or raise ImportError naming the pip command that installs it."""
    if _found(module.split(".")[0]) and _found(module):
        return importlib.import_module(module)
    parts = module.split(".")
    prefixes = (".".join(parts[:i]) for i in range(len(parts), 0, -1))  # the longest known prefix names the extra
    extra, purpose = next((EXTRAS[p] for p in prefixes if p in EXTRAS), (None, module))
    how = f"pip install 'hasten[{extra}]'" if extra else f"pip install {module.split('.')[0]}"
    raise ImportError(f"{feature or purpose} needs the `{module}` package, which is not installed: {how}")
