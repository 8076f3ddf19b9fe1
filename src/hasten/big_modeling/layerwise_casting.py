"""Layerwise casting: weights stored in a small dtype, computed in a larger one, one layer at a time.

Each supported layer (``Linear`` and the convolutions) keeps its weights in ``storage_dtype`` (e.g.
``torch.float8_e4m3fn`` or ``bfloat16``) and is cast to ``compute_dtype`` just for its own forward, then back.
Memory then holds the whole model in the storage dtype plus one layer in the compute dtype. Going back is
exact (the compute dtype is the larger one), so the stored weights never drift; the quality loss is that of
storing in the small dtype once.
"""
from __future__ import annotations

import functools
import logging
import re
import sys
from typing import Any, Optional, Union

import torch
from torch import nn

from ..core.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
from .hooks import ForwardArguments, ModelHook, add_hook_to_module

__all__ = ["LayerwiseCastingHook", "attach_layerwise_casting_hooks"]

logger = logging.getLogger(__name__)


def _not_compiled(method):
    """Keep ``method`` out of ``torch.compile`` graphs (a dtype cast of a module's weights cannot be traced).

    ``torch.compiler.disable`` imports dynamo, which takes seconds: it is applied only once dynamo is loaded,
    i.e. when something may compile.
    """
    disabled = None

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        nonlocal disabled
        if "torch._dynamo" not in sys.modules:
            return method(*args, **kwargs)
        if disabled is None:
            disabled = torch.compiler.disable(method)
        return disabled(*args, **kwargs)

    return wrapper


class LayerwiseCastingHook(ModelHook):
    """Keep a module's weights in ``storage_dtype``; cast them to ``compute_dtype`` for each forward.

    Attaching the hook casts the module to the storage dtype. Only floating-point parameters and buffers are
    cast (``nn.Module.to(dtype=...)``).
    """

    _is_stateful = False

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return module

    @_not_compiled
    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> ForwardArguments:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    @_not_compiled
    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: Optional[Union[str, tuple[str, ...]]] = None,
    skip_modules_classes: Optional[tuple[type[nn.Module], ...]] = None,
    non_blocking: bool = False,
) -> None:
    """Store the weights of every ``Linear`` / convolution layer of ``module`` in ``storage_dtype`` and run each
    layer in ``compute_dtype`` (a ``LayerwiseCastingHook`` per layer, added after any hook it already has).

    Layers whose qualified name matches one of ``skip_modules_pattern`` (regular expressions, ``re.search``; one
    string or several) or that are instances of ``skip_modules_classes`` are left alone, with everything inside
    them: e.g. ``skip_modules_pattern=("norm",)`` keeps normalisation layers in full precision. Other layers
    (normalisation, embeddings ...) are not cast at all.

    Example::

        attach_layerwise_casting_hooks(model, storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
        with torch.no_grad():
            model(inputs)
    """
    if isinstance(skip_modules_pattern, str):
        skip_modules_pattern = (skip_modules_pattern,)
    patterns = [re.compile(pattern) for pattern in skip_modules_pattern or ()]
    skip_classes = tuple(skip_modules_classes or ())
    _attach(module, "", storage_dtype, compute_dtype, patterns, skip_classes, non_blocking)


def _attach(module: nn.Module, name: str, storage_dtype, compute_dtype, patterns, skip_classes,
            non_blocking: bool) -> None:
    if (skip_classes and isinstance(module, skip_classes)) or any(pattern.search(name) for pattern in patterns):
        logger.debug('Skipping layerwise casting for layer "%s"', name)
        return
    if isinstance(module, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
        logger.debug('Applying layerwise casting to layer "%s"', name)
        hook = LayerwiseCastingHook(storage_dtype=storage_dtype, compute_dtype=compute_dtype,
                                    non_blocking=non_blocking)
        add_hook_to_module(module, hook, append=True)
        return
    for child_name, child in module.named_children():
        _attach(child, f"{name}.{child_name}" if name else child_name, storage_dtype, compute_dtype, patterns,
                skip_classes, non_blocking)
