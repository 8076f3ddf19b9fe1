"""Accelerate's import path ``accelerate.utils.fsdp_utils``: FSDP helper functions (``hasten/strategies/``)."""
from ..compile import is_compiled_module  # noqa: F401
from ..config.fsdp import get_module_class_from_name  # noqa: F401
from ..core.constants import SAFE_WEIGHTS_NAME, WEIGHTS_NAME  # noqa: F401
from ..logging import get_logger  # noqa: F401
from ..strategies.fsdp.checkpoint_files import (  # noqa: F401
    fsdp2_apply_ac,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    load_fsdp_model,
    load_fsdp_optimizer,
    save_fsdp_model,
    save_fsdp_optimizer,
)
from ..strategies.fsdp.functions import (  # noqa: F401
    _distributed_checkpoint_to_merged_weights,
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    ensure_weights_retied,
    fsdp2_canonicalize_names,
    fsdp2_prepare_auto_wrap_policy,
    get_fsdp2_grad_scaler,
    get_parameters_from_modules,
    logger,
    merge_fsdp_weights,
)

__all__ = [
    "enable_fsdp_ram_efficient_loading", "disable_fsdp_ram_efficient_loading", "save_fsdp_model", "load_fsdp_model",
    "save_fsdp_optimizer", "load_fsdp_optimizer", "merge_fsdp_weights", "ensure_weights_retied",
    "fsdp2_load_full_state_dict", "fsdp2_switch_optimizer_parameters", "fsdp2_apply_ac", "fsdp2_prepare_model",
    "fsdp2_prepare_auto_wrap_policy", "get_fsdp2_grad_scaler", "fsdp2_canonicalize_names",
    "get_parameters_from_modules", "get_module_class_from_name", "get_logger", "is_compiled_module",
    "SAFE_WEIGHTS_NAME", "WEIGHTS_NAME",
]
