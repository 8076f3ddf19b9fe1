"""Accelerate's ``utils`` names, each re-exported lazily from the module that defines it."""
from ._lazy import build_table, lazy_exports

_EXPORTS = build_table({
    "hasten.config.enums": ["DistributedType", "RNGType", "PrecisionType", "DynamoBackend", "ComputeEnvironment",
                            "LoggerType"],
    "hasten.config.config_file": ["write_basic_config", "default_config_file", "load_config_file"],
    "hasten.utils.environment": ["str_to_bool", "parse_flag_from_env", "parse_choice_from_env", "get_int_from_env",
                                 "patch_environment", "clear_environment", "is_debug_mode"],
    "hasten.utils.operations": [
        "broadcast", "broadcast_object_list", "concatenate", "convert_to_fp32", "convert_outputs_to_fp32",
        "gather", "gather_object", "listify", "pad_across_processes", "recursively_apply", "reduce",
        "send_to_device", "slice_tensors", "find_batch_size", "is_torch_tensor", "honor_type", "find_device",
        "DistributedOperationException", "TensorInformation", "get_data_structure", "initialize_tensors",
        "ignorant_find_batch_size", "is_namedtuple", "is_tensor_information", "CannotPadNestedTensorWarning",
    ],
    "hasten.precision": ["get_grad_scaler", "get_mixed_precision_context_manager"],
    "hasten.utils.versions": ["compare_versions", "is_torch_version"],
    "hasten.utils.random": ["set_seed", "synchronize_rng_states", "synchronize_rng_state"],
    "hasten.utils.serialization": ["save", "load"],
    "hasten.utils.memory": ["find_executable_batch_size", "release_memory", "clear_device_cache",
                            "should_reduce_batch_size"],
    "hasten.utils.modeling": ["extract_model_from_parallel", "get_module_children_bottom_up"],
    "hasten.utils.numa": ["set_numa_affinity", "override_numa_affinity", "NumaUnavailableError"],
    "hasten.utils.xla": ["install_xla"],
    "hasten.utils.network": ["find_free_port", "is_port_in_use"],
    "hasten.utils.tqdm": ["tqdm"],
    "hasten.utils.imports": ["is_deepspeed_available", "is_bnb_available", "is_torchdata_stateful_dataloader_available",
                             "is_megatron_lm_available", "is_tensorboard_available", "is_wandb_available",
                             "is_mlflow_available", "is_torchao_available", "require_extra"],
    "hasten.config.data": ["DataLoaderConfiguration"],
    "hasten.config.kwargs": ["KwargsHandler", "DistributedDataParallelKwargs", "DDPCommunicationHookType",
                             "GradScalerKwargs", "InitProcessGroupKwargs", "AutocastKwargs", "ProfileKwargs"],
    "hasten.config.accumulation": ["GradientAccumulationPlugin"],
    "hasten.config.dynamo": ["TorchDynamoPlugin"],
    "hasten.config.project": ["ProjectConfiguration"],
    "hasten.big_modeling.sizes": ["compute_module_sizes", "get_max_layer_size", "get_max_memory", "get_balanced_memory",
                                  "convert_file_size_to_int", "dtype_byte_size"],
    "hasten.big_modeling.device_map": ["infer_auto_device_map", "check_device_map"],
    "hasten.big_modeling.loading": ["load_state_dict", "load_checkpoint_in_model", "set_module_tensor_to_device"],
    "hasten.big_modeling.offload": ["offload_state_dict", "load_offloaded_weights", "OffloadedWeightsLoader",
                                    "offload_weight"],
    "hasten.big_modeling.tied": ["find_tied_parameters", "retie_parameters"],
})

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
