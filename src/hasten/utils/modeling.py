"""Accelerate's import path ``accelerate.utils.modeling``: the model-unwrapping helpers (``hasten/core/modules.py``)
and, as in Accelerate, the big-model helpers (``hasten/big_modeling/``) and the precision helpers
(``hasten/precision/``), the last two served on first use."""
from ..core.constants import WEIGHTS_INDEX_NAME  # noqa: F401
from ..core.lazy import build_table, lazy_exports
from ..core.modules import (  # noqa: F401
    check_device_same,
    check_tied_parameters_in_config,
    extract_model_from_parallel,
    get_module_children_bottom_up,
    id_tensor_storage,
    is_peft_model,
)

__getattr__, __dir__ = lazy_exports(__name__, build_table({
    "hasten.big_modeling.sizes": ["compute_module_sizes", "get_max_layer_size", "get_max_memory", "get_balanced_memory",
                                  "convert_file_size_to_int", "dtype_byte_size", "compute_module_total_buffer_size",
                                  "calculate_maximum_sizes"],
    "hasten.big_modeling.device_map": ["infer_auto_device_map", "check_device_map", "clean_device_map",
                                       "check_tied_parameters_on_same_device"],
    "hasten.big_modeling.loading": ["load_state_dict", "load_checkpoint_in_model", "set_module_tensor_to_device"],
    "hasten.big_modeling.tied": ["find_tied_parameters", "retie_parameters"],
    "hasten.big_modeling.module_tensors": ["named_module_tensors", "get_non_persistent_buffers"],
    "hasten.big_modeling.offload": ["load_offloaded_weights"],
    "hasten.big_modeling.offloaded_state": ["has_offloaded_params", "align_module_device",
                                            "get_state_dict_offloaded_model", "get_state_dict_from_offload"],
    "hasten.precision.autocast": ["get_mixed_precision_context_manager", "get_grad_scaler"],
    "hasten.big_modeling.module_allocation": ["get_module_leaves", "get_module_size_with_ties", "fallback_allocate"],
}))

__all__ = [
    "extract_model_from_parallel", "get_module_children_bottom_up", "is_peft_model", "check_device_same",
    "id_tensor_storage", "check_tied_parameters_in_config", "check_tied_parameters_on_same_device",
    "WEIGHTS_INDEX_NAME",
]
