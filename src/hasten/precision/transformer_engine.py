"""Accelerate's ``accelerate.utils.transformer_engine`` names. fp8 with TransformerEngine is planned, not built yet.

``has_transformer_engine_layers`` works without TransformerEngine; converting a model and fp8 autocast raise
``NotYetSupportedError``. transformer_engine is never imported.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

from ..core.planned import not_yet_supported

if TYPE_CHECKING:
    from torch import nn
    from transformer_engine.common.recipe import Recipe

    from ..config.fp8 import TERecipeKwargs
    from ..core.planned import NotYetSupportedError

__all__ = ["convert_model", "has_transformer_engine_layers", "contextual_fp8_autocast", "apply_fp8_autowrap"]

_MEANWHILE = "train in bf16 (mixed_precision='bf16')"


def _te(what: str) -> NotYetSupportedError:
    return not_yet_supported(f"fp8 with TransformerEngine ({what})", _MEANWHILE)


def convert_model(model: nn.Module, to_transformer_engine: bool = True, _convert_linear: bool = True,
                  _convert_ln: bool = True) -> NoReturn:
    """Swap ``nn.Linear`` / ``nn.LayerNorm`` layers for TransformerEngine's, or back (planned)."""
    raise _te("convert_model")


def has_transformer_engine_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds TransformerEngine layers (``Linear``, ``LayerNorm``, ``TransformerLayer``)."""
    te = sys.modules.get("transformer_engine.pytorch") or sys.modules.get("intel_transformer_engine")
    if te is None:  # never imported, so no such layer can exist
        return False
    names = ("LayerNorm", "Linear", "TransformerLayer")
    layer_classes = tuple(getattr(te, name) for name in names if hasattr(te, name))
    return any(isinstance(module, layer_classes) for module in model.modules())


def contextual_fp8_autocast(model_forward: Callable[..., Any], fp8_recipe: Recipe,
                            use_during_eval: bool = False) -> NoReturn:
    """``model_forward`` run under TransformerEngine's fp8 autocast in training mode (planned)."""
    raise _te("contextual_fp8_autocast")


def apply_fp8_autowrap(model: nn.Module, fp8_recipe_handler: Optional[TERecipeKwargs]) -> NoReturn:
    """Wrap ``model.forward`` in fp8 autocast with the recipe of ``fp8_recipe_handler`` (planned)."""
    raise _te("apply_fp8_autowrap")
