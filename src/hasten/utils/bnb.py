"""Accelerate's import path ``accelerate.utils.bnb``: bitsandbytes quantized loading (``hasten/quantization/``).

bitsandbytes is imported only when a model is quantized: the questions about a model (``has_4bit_bnb_layers``,
``get_keys_to_not_convert``, ``get_parameter_device``) work without it.
"""
from ..quantization.backend import get_parameter_device, has_4bit_bnb_layers  # noqa: F401
from ..quantization.load import get_quantized_model_device_map, load_and_quantize_model  # noqa: F401
from ..quantization.offload import quantize_and_offload_8bit  # noqa: F401
from ..quantization.replace import replace_with_bnb_layers  # noqa: F401
from ..quantization.skip import get_keys_to_not_convert  # noqa: F401

__all__ = [
    "load_and_quantize_model", "get_quantized_model_device_map", "replace_with_bnb_layers",
    "get_keys_to_not_convert", "has_4bit_bnb_layers", "get_parameter_device", "quantize_and_offload_8bit",
]
