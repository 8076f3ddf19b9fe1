"""Which submodules FSDP shards as units of their own, which parameters it leaves alone, and activation
checkpointing of those units: decided from a ``FullyShardedDataParallelPlugin`` without changing the plugin.

The auto-wrap policies are torch's FSDP1 callables (``transformer_auto_wrap_policy``,
``size_based_auto_wrap_policy``, or the user's), asked about each submodule in post-order with the number of
parameters not yet inside a unit below it, as FSDP1 itself asks them; FSDP2 then calls ``fully_shard`` on each
unit and finally on the root.
"""
from __future__ import annotations

import contextlib
import functools
import re
from typing import TYPE_CHECKING, Callable, ContextManager, Iterable, Iterator, Optional, Union

from torch import nn

from ...checkpointing.optimizer_names import clean_name

if TYPE_CHECKING:
    from ...config.fsdp import FullyShardedDataParallelPlugin

__all__ = ["wrap_policy", "wrap_units", "ignored_parameters", "apply_activation_checkpointing", "clean_name"]

def _class_names(model: nn.Module) -> list[str]:
    return sorted({type(module).__name__ for module in model.modules()})


def wrap_policy(model: nn.Module, plugin: FullyShardedDataParallelPlugin) -> Optional[Callable[[nn.Module, int], bool]]:
    """``decide(module, unwrapped_numel) -> bool`` for ``plugin.auto_wrap_policy`` on ``model``; None: no units."""
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    policy = plugin.auto_wrap_policy
    if policy is None:
        return None
    base = policy.func if isinstance(policy, functools.partial) else policy
    if base is transformer_auto_wrap_policy and "transformer_layer_cls" not in getattr(policy, "keywords", {}):
        names = plugin.transformer_cls_names_to_wrap
        if not names:
            names = list(getattr(model, "_no_split_modules", None) or [])
        if not names:
            raise ValueError(
                "auto_wrap_policy='transformer_based_wrap' needs the layer classes to wrap: set "
                "transformer_cls_names_to_wrap (FSDP_TRANSFORMER_CLS_TO_WRAP), or give the model a "
                f"_no_split_modules list. The model's classes: {', '.join(_class_names(model))}.")
        by_name = {type(module).__name__: type(module) for module in model.modules()}
        missing = [name for name in names if name not in by_name]
        if missing:
            raise ValueError(
                f"transformer_cls_names_to_wrap names {missing}, which are not classes of this model; its classes "
                f"are: {', '.join(_class_names(model))}.")
        classes = tuple(by_name[name] for name in names)
        return lambda module, numel: isinstance(module, classes)
    if base is size_based_auto_wrap_policy and "min_num_params" not in getattr(policy, "keywords", {}):
        minimum = plugin.min_num_params or 0
        if minimum <= 0:
            return None
        return lambda module, numel: numel >= minimum
    return lambda module, numel: bool(policy(module=module, recurse=False, nonwrapped_numel=numel))


def wrap_units(model: nn.Module, decide: Optional[Callable[[nn.Module, int], bool]]) -> list[nn.Module]:
    """The submodules (not the root) that ``decide`` makes units, children before their parents."""
    if decide is None:
        return []
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> int:
        """Parameters of ``module`` not inside a unit (after making its qualifying descendants units)."""
        remaining = sum(p.numel() for p in module.parameters(recurse=False))
        for child in module.children():
            remaining += visit(child)
        if module is not model and decide(module, remaining):
            units.append(module)
            return 0
        return remaining

    visit(model)
    return units


def ignored_parameters(model: nn.Module,
                       ignored_modules: Optional[Union[str, Iterable[nn.Module]]]) -> set[nn.Parameter]:
    """The parameters FSDP must leave alone: those of ``ignored_modules`` (modules, or a regular expression
    fullmatched against submodule names)."""
    return {param for module in ignored_submodules(model, ignored_modules) for param in module.parameters()}


def ignored_submodules(model: nn.Module,
                       ignored_modules: Optional[Union[str, Iterable[nn.Module]]]) -> list[nn.Module]:
    """The modules ``ignored_modules`` names: the modules themselves, or those whose names a regular expression
    fullmatches (a pattern matching none is refused, showing what the names look like)."""
    if ignored_modules is None:
        return []
    if isinstance(ignored_modules, str):
        pattern = re.compile(ignored_modules)
        modules = [module for name, module in model.named_modules() if name and pattern.fullmatch(name)]
        if not modules:
            raise ValueError(f"ignored_modules={ignored_modules!r} matches no submodule name of the model; names "
                             f"look like {[name for name, _ in model.named_modules() if name][:6]}.")
    else:
        modules = list(ignored_modules)
    return modules


def _modes_again() -> tuple[ContextManager, ContextManager]:
    """Activation checkpointing's contexts: nothing for the forward; for the recomputation in the backward pass, the
    function modes the forward ran under again (PyTorch leaves them out there), so that a block recomputes what it
    computed: context parallelism's sequence-sharded attention (``model_parallel/context_parallel.py``) is one."""
    from torch.overrides import _get_current_function_mode_stack

    forward_modes = list(_get_current_function_mode_stack())

    @contextlib.contextmanager
    def recomputing() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            active = _get_current_function_mode_stack()
            for mode in forward_modes:
                if not any(mode is other for other in active):
                    stack.enter_context(mode)
            yield

    return contextlib.nullcontext(), recomputing()


def apply_activation_checkpointing(model: nn.Module, units: list[nn.Module], offload: bool = False) -> None:
    """Recompute each unit's activations in the backward pass instead of keeping them (and, with ``offload``,
    keep the saved inputs in CPU memory); with no units, the model's direct children are checkpointed."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing as apply,
    )
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper,
        offload_wrapper,
    )

    targets = set(map(id, units or list(model.children())))
    wrapper = offload_wrapper if offload else functools.partial(checkpoint_wrapper, context_fn=_modes_again)
    apply(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda module: id(module) in targets)
