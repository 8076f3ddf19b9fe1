"""Accelerate's import path ``accelerate.utils.transformer_engine`` (``hasten/precision/transformer_engine.py``)."""
from ..precision.transformer_engine import (  # noqa: F401
    apply_fp8_autowrap,
    contextual_fp8_autocast,
    convert_model,
    has_transformer_engine_layers,
)

__all__ = [
    "convert_model", "has_transformer_engine_layers", "contextual_fp8_autocast", "apply_fp8_autowrap",
]
