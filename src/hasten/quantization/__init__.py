"""bitsandbytes quantization: 8-bit / 4-bit linear layers loaded straight from a checkpoint.

``replace.py`` swaps the layers, ``checkpoint.py`` checks a checkpoint against the model, ``load.py`` streams and
quantizes it into the big-model device map, ``offload.py`` keeps 8-bit layers on disk, ``sizes.py`` sizes the
result, ``skip.py`` decides what stays unquantized. bitsandbytes is imported lazily (``backend.py``). The
Accelerate import path is ``hasten.utils.bnb``.
"""
from .backend import import_bnb, is_bnb_layer
from .load import get_quantized_model_device_map, load_and_quantize_model
from .offload import quantize_and_offload_8bit
from .replace import replace_with_bnb_layers
from .sizes import quantization_overhead, quantized_module_sizes, quantized_special_dtypes
from .skip import get_keys_to_not_convert

__all__ = ["load_and_quantize_model", "get_quantized_model_device_map", "replace_with_bnb_layers",
           "get_keys_to_not_convert", "quantize_and_offload_8bit", "quantized_module_sizes",
           "quantized_special_dtypes", "quantization_overhead", "import_bnb", "is_bnb_layer"]
