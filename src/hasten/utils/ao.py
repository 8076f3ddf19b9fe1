"""Accelerate's import path ``accelerate.utils.ao``: fp8 training through torchao (``hasten/precision/fp8.py``)."""
from ..precision.fp8 import (  # noqa: F401
    convert_model_to_fp8_ao,
    filter_first_and_last_linear_layers,
    filter_linear_layers,
    find_first_last_linear_layers,
    has_ao_layers,
)

__all__ = [
    "find_first_last_linear_layers", "filter_linear_layers", "filter_first_and_last_linear_layers", "has_ao_layers",
    "convert_model_to_fp8_ao",
]
