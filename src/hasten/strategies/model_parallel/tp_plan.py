"""Tensor-parallel plans: which modules are split over the ``tp`` mesh dimension, and how.

A plan is ``{module name pattern: style}``, the convention transformers uses for ``model._tp_plan`` /
``config.base_model_tp_plan``: ``*`` in a pattern stands for one layer index (``layers.*.self_attn.q_proj``). A
style is a torch ``ParallelStyle`` or one of these names:

=====================  ====================================================================================
``"colwise"``          ``ColwiseParallel()``: the weight's output features split; the output stays split
``"rowwise"``          ``RowwiseParallel()``: the input features split; the output summed (replicated)
``"colwise_rep"``      ``ColwiseParallel(output_layouts=Replicate())``: split, the output gathered whole
``"rowwise_rep"``      ``RowwiseParallel(input_layouts=Replicate())``: a whole input split here
``"sequence_parallel"``  ``SequenceParallel()``: norms / dropout computed on a slice of the sequence
``"loss_parallel"``    ``ColwiseParallel(use_local_output=False)`` for the output head: the logits stay a DTensor
                       split over the classes, and the cross-entropy is computed on the split logits inside
                       ``accelerator.loss_parallel()`` (torch's ``loss_parallel``), never gathering them whole
=====================  ====================================================================================

transformers' other names for the same styles are accepted too: ``"colwise_gather_output"`` (``"colwise_rep"``)
and ``"embedding_rowwise"`` (an embedding split by vocabulary rows, its output summed); ``"replicate"`` /
``"replicated_with_grad_allreduce"`` leave a module whole (every rank computes it alike).

``resolve_plan`` expands the patterns against the model's module names (as the model defines them: wrappers added
around its blocks, activation checkpointing's or compile's, are seen through) and checks every entry before anything
is changed: a pattern that names no module, a style that does not exist, or a split dimension that the tp size
does not divide is an error naming the module (and listing the model's modules).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["STYLE_NAMES", "resolve_plan", "plan_of", "is_tensor_parallel", "apply_plan", "splits_the_logits"]

STYLE_NAMES = ("colwise", "rowwise", "colwise_rep", "rowwise_rep", "sequence_parallel", "loss_parallel",
               "colwise_gather_output", "embedding_rowwise", "replicate", "replicated_with_grad_allreduce")
_WHOLE = ("replicate", "replicated_with_grad_allreduce")  # styles that leave the module as it is


def _style(name_or_style, where: str):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

    if isinstance(name_or_style, ParallelStyle):
        return name_or_style
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel,
              "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
              "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
              "sequence_parallel": SequenceParallel,
              "loss_parallel": lambda: ColwiseParallel(use_local_output=False),
              "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
              "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate())}
    if name_or_style not in styles:
        raise ValueError(f"The tensor-parallel plan's style for {where!r} is {name_or_style!r}: use one of "
                         f"{list(STYLE_NAMES)} or a torch.distributed.tensor.parallel.ParallelStyle.")
    return styles[name_or_style]()


def _pattern(text: str) -> re.Pattern:
    return re.compile("^" + re.escape(text).replace(r"\*", r"\d+") + "$")


def plan_of(model: nn.Module, given: Optional[dict] = None) -> Optional[dict]:
    """The plan to apply: ``given`` (a ``TorchTensorParallelConfig.tp_plan``), else the model's ``_tp_plan``, else
    its config's ``base_model_tp_plan`` under the base model's prefix; None when there is none."""
    if given:
        return dict(given)
    own = getattr(model, "_tp_plan", None)
    if own:
        return dict(own)
    base = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
    if base:
        prefix = getattr(model, "base_model_prefix", "")
        prefixed = prefix and hasattr(model, prefix) and getattr(model, prefix) is not model
        return {f"{prefix}.{key}" if prefixed else key: value for key, value in base.items()}
    return None


def is_tensor_parallel(model: nn.Module) -> bool:
    """Whether the model's parameters are already DTensors (parallelized before ``prepare``)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def resolve_plan(model: nn.Module, plan: dict, tp_size: int) -> dict:
    """``{module name: ParallelStyle}`` for every module the plan's patterns name; checked (see the module doc)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from ...checkpointing.optimizer_names import clean_name

    modules = dict(model.named_modules())
    # the plan names modules as the model defines them: a wrapper added around a block (activation checkpointing,
    # compile) is seen through, and the module it wraps (named after it) is the one split
    real = {clean_name(name + ".").rstrip("."): name for name in modules if name}
    names = list(real)
    resolved = {}
    for pattern, style in plan.items():
        matched = [real[name] for name in names if _pattern(pattern).match(name)]
        if not matched:
            shown = ", ".join(names[:40]) + (" ..." if len(names) > 40 else "")
            raise ValueError(f"The tensor-parallel plan names {pattern!r}, which matches no module of the "
                             f"{type(model).__name__}; its modules are: {shown}.")
        for name in matched:
            if isinstance(style, str) and style in _WHOLE:
                continue
            resolved[name] = _style(style, name)
            _check_divisible(name, modules[name], resolved[name], tp_size, ColwiseParallel, RowwiseParallel)
    return resolved


def _check_divisible(name, module, style, tp_size, colwise, rowwise) -> None:
    weight = getattr(module, "weight", None)
    if weight is None or weight.dim() < 2:
        return
    if isinstance(style, colwise):
        dim, what = (1, "embedding dimension") if isinstance(module, nn.Embedding) else (0, "output features")
    elif isinstance(style, rowwise):
        dim, what = (0, "rows (vocabulary)") if isinstance(module, nn.Embedding) else (1, "input features")
    else:
        return
    if weight.shape[dim] % tp_size:
        raise ValueError(f"{name!r} ({type(module).__name__}) has {weight.shape[dim]} {what}, which tp_size={tp_size} "
                         f"does not divide: choose a tp size that divides it, or leave {name!r} out of the plan.")


def apply_plan(model: nn.Module, plan: dict, tp_mesh: DeviceMesh) -> nn.Module:
    """Split ``model`` in place over ``tp_mesh`` with the resolved plan (``resolve_plan``)."""
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, tp_mesh, plan)


def splits_the_logits(plan: dict) -> bool:
    """Whether a resolved plan leaves some module's output a DTensor split over its last dimension (a
    ``"loss_parallel"`` head): the loss is then computed with torch's ``loss_parallel``."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    for style in plan.values():
        if isinstance(style, ColwiseParallel) and not style.use_local_output:
            layouts = style.output_layouts if isinstance(style.output_layouts, tuple) else (style.output_layouts,)
            if any(isinstance(layout, Shard) for layout in layouts):
                return True
    return False
