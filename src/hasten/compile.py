"""Applying ``torch.compile`` to prepared models, whole or region by region.

Regional compilation compiles each block of a repeated stack (e.g. the 12 identical transformer layers of a
``ModuleList``) separately. The blocks share one class and so one piece of code: the compiler's cache is hit
for every block after the first, which cuts cold-start time. Parts of the model outside repeated stacks are
compiled as their own regions. Blocks are compiled in place (``nn.Module.compile``), so parameters keep their
identity and optimizers created before ``prepare`` keep working.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional

from torch import nn

if TYPE_CHECKING:
    from .config.dynamo import TorchDynamoPlugin

__all__ = ["compile_model", "compile_regions", "remove_regional_compilation", "repeated_block_containers",
           "is_compiled_module", "has_compiled_regions", "is_repeated_blocks", "has_repeated_blocks",
           "compile_regions_deepspeed", "compile_regions_fsdp2"]

_REGIONS_ATTRIBUTE = "_hasten_compiled_regions"


def _is_repeated_stack(module: nn.Module) -> bool:
    children = list(module.children())
    return (isinstance(module, (nn.ModuleList, nn.Sequential)) and len(children) > 1
            and len({type(child) for child in children}) == 1)


def repeated_block_containers(model: nn.Module) -> list[nn.Module]:
    """The ``ModuleList``/``Sequential`` containers (outermost first) whose children are blocks of one class."""
    found = []

    def visit(module):
        if _is_repeated_stack(module):
            found.append(module)
            return
        for child in module.children():
            visit(child)

    visit(model)
    return found


def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Compile ``module`` region by region (in place) and return it; the whole module if nothing repeats."""
    containers = repeated_block_containers(module)
    if not containers:
        return compile_model(module, **compile_kwargs)
    stacks = {id(container) for container in containers}
    regions = []

    def visit(part):
        if id(part) in stacks:
            regions.extend(part.children())  # each repeated block is a region
        elif any(id(m) in stacks for m in part.modules()):
            for child in part.children():
                visit(child)
        else:
            regions.append(part)  # a part with no stack inside is one region

    for child in module.children():
        visit(child)
    for region in regions:
        region.compile(**compile_kwargs)
    setattr(module, _REGIONS_ATTRIBUTE, regions)
    return module


def compile_model(model: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """``torch.compile(model)``: an ``OptimizedModule`` around the model (parameters shared)."""
    import torch

    return torch.compile(model, **compile_kwargs)


def remove_regional_compilation(model: nn.Module) -> nn.Module:
    """Undo ``compile_regions`` in place: every region runs eagerly again."""
    for region in model.__dict__.pop(_REGIONS_ATTRIBUTE, []):
        region._compiled_call_impl = None
    return model


def apply_dynamo_plugin(model: nn.Module, plugin: Optional[TorchDynamoPlugin]) -> nn.Module:
    """Compile ``model`` as the ``TorchDynamoPlugin`` says (unchanged when compilation is off)."""
    if plugin is None or not plugin.enabled:
        return model
    kwargs = plugin.compile_kwargs()
    if plugin.use_regional_compilation:
        return compile_regions(model, **kwargs)
    return compile_model(model, **kwargs)


# ----------------------------------------------------------------------------- what is compiled
def _optimized_module_type():
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # nothing was compiled if dynamo was never imported
    return getattr(eval_frame, "OptimizedModule", None)


def is_compiled_module(module: nn.Module) -> bool:
    """Whether ``module`` is the wrapper ``torch.compile(model)`` returns."""
    optimized = _optimized_module_type()
    return optimized is not None and isinstance(module, optimized)


def has_compiled_regions(module: nn.Module) -> bool:
    """Whether ``module`` or one of its submodules is compiled: wrapped by ``torch.compile`` or compiled in
    place (``nn.Module.compile``, what ``compile_regions`` does)."""
    if _optimized_module_type() is None:
        return False
    return any(is_compiled_module(sub) or getattr(sub, "_compiled_call_impl", None) is not None
               for sub in module.modules())


def is_repeated_blocks(module: nn.Module) -> bool:
    """Whether ``module`` is a stack that regional compilation compiles block by block: a ``ModuleList`` or
    ``Sequential`` of two or more children of one class."""
    containers = repeated_block_containers(module)
    return bool(containers) and containers[0] is module


def has_repeated_blocks(module: nn.Module) -> bool:
    """Whether ``module`` holds such a stack at any depth (itself included)."""
    return bool(repeated_block_containers(module))


def compile_regions_deepspeed(module: nn.Module, **compile_kwargs: Any) -> None:
    """Regional compilation of a DeepSpeed engine's inner model, in place (hasten's ``compile_regions``)."""
    compile_regions(module, **compile_kwargs)


def compile_regions_fsdp2(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Regional compilation in place, so hooks that ``fully_shard`` adds later still run; returns ``module``."""
    return compile_regions(module, **compile_kwargs)
