"""Accelerate's ``accelerate.utils.fsdp_utils`` names.

Merging a sharded (DCP) checkpoint into one file (``merge_fsdp_weights``, CPU only), the RAM-efficient-loading
switches for Transformers, the FSDP2 wrap policy, grad scaler and name helpers and ``ensure_weights_retied`` are
here; the model and optimizer file functions and the FSDP2 preparation helpers live in ``fsdp/checkpoint_files.py``
(they work on hasten's FSDP strategy) and are importable from here too.
"""
from __future__ import annotations

import os
import re
import shutil
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch

from ...checkpointing.sharded_files import ShardedFormat
from ...config.fsdp import layer_classes
from ...core.constants import SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from ...logging import get_logger
from .checkpoint_files import (
    fsdp2_apply_ac,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    load_fsdp_model,
    load_fsdp_optimizer,
    save_fsdp_model,
    save_fsdp_optimizer,
)

if TYPE_CHECKING:
    from torch.amp.grad_scaler import GradScaler

    from ...config.fsdp import FullyShardedDataParallelPlugin
    from ...core.aliases import Device

__all__ = [
    "enable_fsdp_ram_efficient_loading", "disable_fsdp_ram_efficient_loading", "save_fsdp_model", "load_fsdp_model",
    "save_fsdp_optimizer", "load_fsdp_optimizer", "merge_fsdp_weights", "ensure_weights_retied",
    "fsdp2_load_full_state_dict", "fsdp2_switch_optimizer_parameters", "fsdp2_apply_ac", "fsdp2_prepare_model",
    "fsdp2_prepare_auto_wrap_policy", "get_fsdp2_grad_scaler", "fsdp2_canonicalize_names",
    "get_parameters_from_modules",
]

logger = get_logger(__name__)

# Transformers reads these two variables (``transformers.modeling_utils.is_fsdp_enabled``) to load weights on the
# first process only; their names are Transformers', not hasten's.
def enable_fsdp_ram_efficient_loading() -> None:
    """Let Transformers load a pretrained model's weights on the first process only (the others get empty ones)."""
    if "ACCELERATE_USE_FSDP" not in os.environ:
        os.environ["ACCELERATE_USE_FSDP"] = "True"
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "True"


def disable_fsdp_ram_efficient_loading() -> None:
    """Undo ``enable_fsdp_ram_efficient_loading``: every process loads the weights."""
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "False"


def _distributed_checkpoint_to_merged_weights(checkpoint_dir, save_path, safe_serialization: bool = True, *,
                                             weights_only: bool = True) -> Path:
    """Read every shard of the DCP checkpoint in ``checkpoint_dir`` (one process, CPU) and write one file.
    Nothing in it is unpickled beyond DCP metadata and plain values unless ``weights_only=False`` (trusted only)."""
    from ...checkpointing.safe_dcp import read_dcp_checkpoint
    from ...checkpointing.serialization import save

    state_dict = read_dcp_checkpoint(checkpoint_dir, weights_only=weights_only,
                                     unsafe_hint="merge_fsdp_weights(..., weights_only=False)")
    if len(state_dict) == 1 and isinstance(next(iter(state_dict.values())), dict):
        state_dict = next(iter(state_dict.values()))  # {"model": {...}} as Accelerate's FSDP saving writes it
    save_path = Path(save_path)
    save_path.mkdir(parents=True, exist_ok=True)
    target = save_path / (SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME)
    save(state_dict, target, safe_serialization=safe_serialization)
    return target


def merge_fsdp_weights(checkpoint_dir: str, output_path: str, safe_serialization: bool = True,
                       remove_checkpoint_dir: bool = False, *, weights_only: bool = True) -> None:
    """Merge a sharded FSDP checkpoint (``SHARDED_STATE_DICT``, written with ``torch.distributed.checkpoint``) into
    ``output_path/model.safetensors`` (or ``pytorch_model.bin`` without ``safe_serialization``). CPU only; the main
    process writes, the others wait.

    checkpoint_dir: the folder holding the ``.metadata`` file (e.g. ``.../pytorch_model_fsdp_0``).
    remove_checkpoint_dir: delete ``checkpoint_dir`` once the merged file is written.
    weights_only: read the checkpoint without unpickling arbitrary objects (DCP's own reader would run any code a
        ``.metadata`` file names); ``False`` only for a checkpoint you trust.
    """
    from ...state import PartialState

    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / ".metadata").is_file():
        firsts = (ShardedFormat.model_folder(0), ShardedFormat.optimizer_folder(0))
        hints = [str(checkpoint_dir / sub) for sub in firsts if ShardedFormat.recognises(checkpoint_dir / sub)]
        hint = f" Did you mean {' or '.join(hints)}?" if hints else ""
        raise ValueError(f"{checkpoint_dir} is not a sharded (DCP) checkpoint: it has no .metadata file.{hint}")
    state = PartialState()
    if state.is_main_process:
        logger.info(f"Merging FSDP weights from {checkpoint_dir}")
        target = _distributed_checkpoint_to_merged_weights(checkpoint_dir, output_path, safe_serialization,
                                                           weights_only=weights_only)
        logger.info(f"Merged FSDP weights saved to {target}")
        if remove_checkpoint_dir:
            shutil.rmtree(checkpoint_dir)
    state.wait_for_everyone()


def ensure_weights_retied(param_init_fn: Callable[[torch.nn.Module], torch.nn.Module], model: torch.nn.Module,
                          device: torch.device) -> Callable[[torch.nn.Module], torch.nn.Module]:
    """``param_init_fn`` made to keep the model's tied weights (``model._tied_weights_keys``) tied after it runs.

    Returned unchanged when the model declares no tied weights.
    """
    tied_names = getattr(model, "_tied_weights_keys", None)
    if not tied_names:
        return param_init_fn
    tied_params = {}  # id(original parameter) -> the first re-created parameter, shared by the others
    for name in tied_names:
        module_name, _, param_name = name.rpartition(".")
        tied_params[id(getattr(model.get_submodule(module_name), param_name))] = None

    def param_init_fn_tied_param(module: torch.nn.Module) -> torch.nn.Module:
        to_tie = defaultdict(list)
        for name, param in module.named_parameters(recurse=False):
            if id(param) in tied_params:
                to_tie[id(param)].append(name)
        module = param_init_fn(module)
        for key, names in to_tie.items():
            for name in names:
                if tied_params[key] is None:
                    tied_params[key] = getattr(module, name)
                else:
                    setattr(module, name, tied_params[key])
        return module

    return param_init_fn_tied_param


def fsdp2_prepare_auto_wrap_policy(fsdp2_plugin: FullyShardedDataParallelPlugin,
                                   model: torch.nn.Module) -> Optional[Callable[[torch.nn.Module], bool]]:
    """The plugin's FSDP1-style wrap policy as an FSDP2 predicate ``module -> bool`` (None when it wraps nothing).

    Transformer-based: modules of the classes named in ``transformer_cls_names_to_wrap`` (default: the model's
    ``_no_split_modules``), looking through activation-checkpoint wrappers. Size-based: modules with more than
    ``min_num_params`` parameters.
    """
    import functools

    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    fn = fsdp2_plugin.auto_wrap_policy
    if isinstance(fn, functools.partial):
        fn = fn.func
    if fn is transformer_auto_wrap_policy:
        names = fsdp2_plugin.transformer_cls_names_to_wrap
        if names is None:
            names = list(getattr(model, "_no_split_modules", None) or [])
        classes = tuple(layer_classes(model, names))

        def policy(module: torch.nn.Module) -> bool:
            return bool(classes) and isinstance(getattr(module, "_checkpoint_wrapped_module", module), classes)

        return policy
    if fn is size_based_auto_wrap_policy:
        def policy(module: torch.nn.Module) -> bool:
            return sum(p.numel() for p in module.parameters()) > fsdp2_plugin.min_num_params

        return policy
    return None


def get_fsdp2_grad_scaler(**kwargs: Any) -> GradScaler:
    """A ``torch.amp.GradScaler`` built with ``kwargs``."""
    from torch.amp.grad_scaler import GradScaler

    return GradScaler(**kwargs)


def fsdp2_canonicalize_names(named_params: dict) -> dict:
    """``named_params`` with the names activation checkpointing and ``torch.compile`` add removed."""
    canonical = {}
    for name, value in named_params.items():
        name = name.replace("._checkpoint_wrapped_module", "")
        name = name[len("_orig_mod."):] if name.startswith("_orig_mod.") else name
        canonical[name.replace("._orig_mod", "")] = value
    return canonical


def get_parameters_from_modules(modules: Optional[Union[Iterable[torch.nn.Module], str]], model: torch.nn.Module,
                                device: Device) -> set[torch.nn.Parameter]:
    """The parameters of ``modules`` (modules, or a regex matched in full against ``model``'s module names, which
    are then moved to ``device``)."""
    if modules is None:
        return set()
    if isinstance(modules, str):
        pattern = re.compile(modules)
        matched = []
        for name, module in model.named_modules():
            if pattern.fullmatch(name):
                module.to(device)
                matched.append(module)
        modules = matched
    return {param for module in modules for param in module.parameters()}
