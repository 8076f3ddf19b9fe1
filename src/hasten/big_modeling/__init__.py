"""Big-model inference: build on the meta device, plan a device map, load shard by shard, run with offloading.

The names match ``accelerate.big_modeling`` and ``accelerate.utils``; each is imported on first use.
"""
from ..core.lazy import build_table, lazy_exports

_EXPORTS = build_table({
    "hasten.big_modeling.init_context": ["init_empty_weights", "init_on_device"],
    "hasten.big_modeling.sizes": ["compute_module_sizes", "compute_module_total_buffer_size", "get_max_layer_size",
                                  "get_max_memory", "get_balanced_memory", "convert_file_size_to_int",
                                  "dtype_byte_size", "calculate_maximum_sizes", "convert_bytes"],
    "hasten.big_modeling.device_map": ["infer_auto_device_map", "check_device_map", "clean_device_map",
                                       "check_tied_parameters_on_same_device"],
    "hasten.big_modeling.loading": ["load_state_dict", "load_checkpoint_in_model"],
    "hasten.big_modeling.tensor_placement": ["set_module_tensor_to_device"],
    "hasten.big_modeling.offload": ["offload_state_dict", "load_offloaded_weights", "OffloadedWeightsLoader",
                                    "offload_weight", "load_offloaded_weight", "save_offload_index",
                                    "PrefixedDataset", "extract_submodules_state_dict"],
    "hasten.big_modeling.offloaded_state": ["has_offloaded_params", "align_module_device",
                                            "get_state_dict_offloaded_model", "get_state_dict_from_offload"],
    "hasten.big_modeling.tied": ["find_tied_parameters", "retie_parameters"],
    "hasten.big_modeling.hooks": ["ModelHook", "SequentialHook", "add_hook_to_module", "remove_hook_from_module",
                                  "remove_hook_from_submodules", "AlignDevicesHook", "attach_align_device_hook",
                                  "attach_execution_device_hook", "attach_align_device_hook_on_blocks",
                                  "CpuOffload", "UserCpuOffloadHook"],
    "hasten.big_modeling.dispatch": ["dispatch_model", "cpu_offload", "cpu_offload_with_hook", "disk_offload",
                                     "load_checkpoint_and_dispatch"],
    "hasten.big_modeling.module_tensors": ["named_module_tensors", "get_non_persistent_buffers"],
    "hasten.big_modeling.layerwise_casting": ["attach_layerwise_casting_hooks", "LayerwiseCastingHook"],
})

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
