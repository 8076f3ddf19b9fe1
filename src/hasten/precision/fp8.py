"""The fp8 family: training with torchao's ``Float8Linear`` (``mixed_precision="fp8"``, ``Float8Precision``), and
Accelerate's ``accelerate.utils.ao`` helpers.

The layer filters and ``has_ao_layers`` work without torchao; ``Float8Precision`` and ``convert_model_to_fp8_ao``
need it (an ``ImportError`` naming the extra otherwise) and import it only when used.
"""
from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING, Callable, Optional

import torch

from ..config.fp8 import FP8BackendType
from ..core.imports import is_torchao_available, require_extra
from .autocast import MixedPrecision

if TYPE_CHECKING:
    from torchao.float8 import Float8LinearConfig

    from ..config.fp8 import AORecipeKwargs
    from ..config.kwargs import AutocastKwargs, GradScalerKwargs

__all__ = ["Float8Precision", "fp8_recipe", "convert_with_recipe", "find_first_last_linear_layers", "filter_linear_layers",
           "filter_first_and_last_linear_layers", "has_ao_layers", "convert_model_to_fp8_ao"]


class Float8Precision(MixedPrecision):
    """fp8 training through torchao: at ``prepare``, the linear layers the recipe's filter keeps become
    ``Float8Linear`` (torchao's dynamic scaling), and the rest computes under bf16 autocast.

    ``recipe``: the run's ``AORecipeKwargs`` (a default one when None). Its ``config`` (a ``Float8LinearConfig``) is
    used as given; when None it is built here from ``pad_inner_dim`` and ``enable_fsdp_float8_all_gather`` and set on
    the recipe, so the script can read it. Its ``module_filter_func`` chooses the layers; by default every linear
    layer whose dimensions divide by 16, except the model's first and last, which stay in higher precision.

    Runs on a GPU of compute capability 8.9 or newer, and on the CPU, where torch computes fp8 matrix products
    too (much more slowly: for checking a script, not for speed). Needs torchao.
    """

    fp8_backend = FP8BackendType.AO

    def __init__(self, device: torch.device, scaler_kwargs: Optional[GradScalerKwargs] = None,
                 autocast_kwargs: Optional[AutocastKwargs] = None,
                 scaler_class: Optional[type[torch.amp.GradScaler]] = None, recipe: Optional[AORecipeKwargs] = None):
        self.recipe = fp8_recipe(device, recipe)
        super().__init__("fp8", device, scaler_kwargs, autocast_kwargs, scaler_class)

    def wrap_forward(self, model: torch.nn.Module) -> torch.nn.Module:
        """Convert the chosen linear layers to fp8 (once: a model that already holds them is left as it is), then
        run the forward under bf16 autocast."""
        return super().wrap_forward(convert_with_recipe(model, self.recipe))

    def plain_state_dict(self, state: dict) -> dict:
        """With ``enable_fsdp_float8_all_gather`` torchao keeps each fp8 layer's weight in a wrapper tensor (its
        data is the one inner tensor): the state dict holds that plain tensor, which files and other runs take."""
        return {key: _inner_tensor(value) for key, value in state.items()}


def fp8_recipe(device: torch.device, recipe: Optional[AORecipeKwargs] = None) -> AORecipeKwargs:
    """The run's ``AORecipeKwargs`` (a default one when None) with its ``config`` built, after checking that fp8
    can train here: torchao installed, and the CPU or a GPU of compute capability 8.9 or newer."""
    if not is_torchao_available():
        raise ImportError("mixed_precision='fp8' trains through torchao, which is not installed: pip install "
                          "'hasten[fp8]' (or use mixed_precision='bf16').")
    if device.type != "cpu" and (device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9)):
        raise RuntimeError(f"mixed_precision='fp8' needs a GPU with fp8 support (compute capability 8.9 or newer, "
                           f"e.g. H100/L40/RTX 4090) or the CPU; this run computes on {device}. Use "
                           "mixed_precision='bf16'.")
    if recipe is None:
        from ..config.fp8 import AORecipeKwargs

        recipe = AORecipeKwargs()
    if recipe.config is None:
        from torchao.float8 import Float8LinearConfig

        recipe.config = Float8LinearConfig(pad_inner_dim=recipe.pad_inner_dim,
                                           enable_fsdp_float8_all_gather=recipe.enable_fsdp_float8_all_gather)
    return recipe


def convert_with_recipe(model: torch.nn.Module, recipe: AORecipeKwargs,
                        fsdp_all_gather: bool = True) -> torch.nn.Module:
    """``model`` with the layers ``recipe`` chooses converted to fp8; a model holding fp8 layers already is returned
    as it is. ``fsdp_all_gather=False`` (an engine that flattens parameters itself, DeepSpeed): the weights stay
    plain tensors whatever the config's ``enable_fsdp_float8_all_gather``, an FSDP2 feature the engine cannot
    move."""
    if has_ao_layers(model):
        return model
    config = recipe.config
    if not fsdp_all_gather and config.enable_fsdp_float8_all_gather:
        import dataclasses

        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=False)
    return convert_model_to_fp8_ao(model, config=config, module_filter_func=recipe.module_filter_func)


def _inner_tensor(value):
    """The one tensor inside a wrapper tensor subclass (torchao's ``WeightWithDynamicFloat8CastTensor``), else
    ``value``."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value):
        names, _ = value.__tensor_flatten__()
        if len(names) == 1:
            return getattr(value, names[0])
    return value


def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[Optional[str], Optional[str]]:
    """Names of the first and the last ``nn.Linear`` of ``model`` (``(None, None)`` when it has none).

    fp8 training keeps them in higher precision: quantizing them tends to make training unstable.
    """
    first, last = None, None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            first = name if first is None else first
            last = name
    return first, last


def filter_linear_layers(module: torch.nn.Module, fqn: str, layers_to_filter: list[str]) -> bool:
    """Whether ``module`` (named ``fqn``) may be converted to fp8: not in ``layers_to_filter``, and, for a linear
    layer, both dimensions divisible by 16."""
    if isinstance(module, torch.nn.Linear) and (module.in_features % 16 or module.out_features % 16):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: torch.nn.Module, fqn: str) -> bool:
    """``filter_linear_layers`` that also keeps the first and last linear layers of ``module`` out."""
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, layers_to_filter=[first, last])


def has_ao_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds torchao ``Float8Linear`` layers."""
    float8_linear = sys.modules.get("torchao.float8.float8_linear")
    if float8_linear is None:  # never imported, so no such layer can exist
        return False
    return any(isinstance(module, float8_linear.Float8Linear) for module in model.modules())


def convert_model_to_fp8_ao(model: torch.nn.Module, config: Optional["Float8LinearConfig"] = None,
                            module_filter_func: Optional[Callable] = None) -> torch.nn.Module:
    """Convert ``model``'s linear layers to torchao's ``Float8Linear`` in place; returns the model (a model that is
    itself one ``nn.Linear`` is replaced, so use the result).

    config: a ``torchao.float8.Float8LinearConfig`` (default: torchao's). module_filter_func: ``(module, fqn) ->
    bool``, which layers to convert; default: every linear layer with dimensions divisible by 16 except the first
    and the last, which stay in higher precision for stability.
    """
    float8 = require_extra("torchao.float8", "fp8 training through torchao")
    if module_filter_func is None:
        first, last = find_first_last_linear_layers(model)
        module_filter_func = partial(filter_linear_layers, layers_to_filter=[first, last])
    return float8.convert_to_float8_training(model, module_filter_fn=module_filter_func, config=config)
