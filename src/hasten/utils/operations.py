"""Accelerate's import path ``accelerate.utils.operations``: collectives on nested structures
(``hasten/collectives/``).
"""
from ..collectives.checks import (  # noqa: F401
    DistributedOperationException,
    collective_checks,
    collective_checks_enabled,
    set_collective_checks,
)
from ..collectives.operations import (  # noqa: F401
    REDUCTIONS,
    TENSOR_INT_TO_DTYPE,
    TENSOR_TYPE_TO_INT,
    CannotPadNestedTensorWarning,
    ConvertOutputsToFp32,
    TensorInformation,
    broadcast,
    broadcast_object_list,
    chained_operation,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    find_device,
    gather,
    gather_object,
    get_data_structure,
    get_shape,
    ignorant_find_batch_size,
    initialize_tensors,
    is_tensor_information,
    is_torch_tensor,
    is_torch_xpu_tensor,
    listify,
    pad_across_processes,
    recursively_apply,
    reduce,
    send_to_device,
    slice_tensors,
    verify_operation,
)
from ..collectives.pipeline_io import copy_tensor_to_devices, gather_tensor_shape, pad_input_tensors  # noqa: F401
from ..core.lazy import lazy_exports
from ..core.nested import honor_type, is_namedtuple  # noqa: F401

# GatheredParameters gathers DeepSpeed ZeRO-3 partitions: served from the DeepSpeed strategy's room on first use
__getattr__, __dir__ = lazy_exports(__name__, {"GatheredParameters": "hasten.strategies.deepspeed.wrappers"})

__all__ = [
    "broadcast", "broadcast_object_list", "concatenate", "convert_to_fp32", "convert_outputs_to_fp32",
    "ConvertOutputsToFp32", "gather", "gather_object", "listify", "pad_across_processes", "recursively_apply",
    "reduce", "send_to_device", "slice_tensors", "find_batch_size", "ignorant_find_batch_size", "is_torch_tensor",
    "is_namedtuple", "honor_type", "find_device", "get_shape", "get_data_structure", "initialize_tensors",
    "TensorInformation", "is_tensor_information", "DistributedOperationException", "CannotPadNestedTensorWarning",
    "is_torch_xpu_tensor", "verify_operation", "chained_operation", "TENSOR_TYPE_TO_INT", "TENSOR_INT_TO_DTYPE",
    "gather_tensor_shape", "copy_tensor_to_devices", "pad_input_tensors", "collective_checks",
    "collective_checks_enabled", "set_collective_checks", "REDUCTIONS", "GatheredParameters",
]
