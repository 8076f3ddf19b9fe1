"""Which modules stay unquantized: the output head and tied weights by default, plus the user's choices."""
from __future__ import annotations

from collections.abc import Iterable
from copy import deepcopy
from typing import TYPE_CHECKING

import torch.nn as nn

from ..big_modeling.init_context import init_empty_weights
from ..big_modeling.tied import find_tied_parameters

if TYPE_CHECKING:
    from ..config.quantization import BnbQuantizationConfig

__all__ = ["get_keys_to_not_convert", "matches_module", "resolve_unquantized"]


def matches_module(name: str, module_names: Iterable[str]) -> bool:
    """Whether ``name`` (a module or tensor path) lies inside a module called one of ``module_names``: a full path
    (``"blocks.0.attn"``) or a name that appears as whole path components (``"head"`` matches ``"x.head.weight"``,
    not ``"x.header"``)."""
    wrapped = f".{name}."
    return any(name == key or f".{key}." in wrapped for key in module_names)


def get_keys_to_not_convert(model: nn.Module) -> list[str]:
    """Names of the modules to keep in full precision: the tied weights and the last module (e.g. ``lm_head``).

    A base model (no head: ``model.base_model_prefix`` is not an attribute) without tied weights keeps nothing;
    neither does a model without children.
    """
    with init_empty_weights():
        tied_model = deepcopy(model)  # no memory: the copy's parameters are on the meta device
    tied_keys = sum(find_tied_parameters(tied_model), [])
    prefix = getattr(model, "base_model_prefix", None)
    is_base_model = prefix is not None and not hasattr(model, prefix)
    children = list(model.named_children())
    if (not tied_keys and is_base_model) or not children:
        return []
    last_module = children[-1][0]
    untouched = list(dict.fromkeys(tied_keys)) + ([last_module] if last_module not in tied_keys else [])
    names = []
    for name in untouched:
        for suffix in (".weight", ".bias"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
        if name not in names:
            names.append(name)
    return names


def resolve_unquantized(model: nn.Module, config: BnbQuantizationConfig) -> tuple[list[str], list[str]]:
    """``(skip_modules, keep_in_fp32_modules)`` for ``model``: the config's, or the default head / tied weights.

    Raises ValueError, listing the model's modules, when a name matches nothing in the model.
    """
    skip = list(config.skip_modules) if config.skip_modules is not None else get_keys_to_not_convert(model)
    keep = list(config.keep_in_fp32_modules or [])
    names = [name for name, _ in model.named_modules() if name]
    for what, wanted in (("skip_modules", config.skip_modules or []), ("keep_in_fp32_modules", keep)):
        unknown = [key for key in wanted if not any(matches_module(name, [key]) for name in names)]
        if unknown:
            shown = ", ".join(names[:40]) + (f", ... ({len(names)} in all)" if len(names) > 40 else "")
            raise ValueError(f"BnbQuantizationConfig.{what} names {unknown}, which match no module of "
                             f"{type(model).__name__}. Its modules are: {shown}.")
    return skip, keep
