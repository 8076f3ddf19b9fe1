"""One rank's output layer under tensor parallelism, for the narrowed model the planner traces.

Transformers' causal-LM classes split their output layer by vocabulary (``_tp_plan = {"lm_head":
"colwise_gather_output"}``): each rank holds ``vocab / t`` rows of the weight, computes its share of the logits and
gathers the whole logits from the others. ``narrow_output_head`` puts a ``GatheredHead`` in the layer's place on a
model built narrowed by ``t`` (``model_source.py``), so that the trace holds what one rank holds: the weight's share
(and its gradients and optimizer state), the share of the logits and the gathered whole.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["GatheredHead", "narrow_output_head"]


class GatheredHead(nn.Module):
    """``vocab / ranks`` rows of an output layer; its output is the whole logits, as the gather returns them."""

    def __init__(self, head: nn.Linear, ranks: int):
        super().__init__()
        self.ranks = ranks
        self.share = nn.Linear(head.in_features, head.out_features // ranks, bias=head.bias is not None,
                               device=head.weight.device, dtype=head.weight.dtype)

    @property
    def weight(self) -> torch.Tensor:
        return self.share.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = self.share(hidden)
        return torch.cat([local] * self.ranks, dim=-1)  # the gathered logits: every rank's share, whole


def narrow_output_head(model: nn.Module, ranks: int) -> bool:
    """Replace ``model``'s output layer by its ``GatheredHead`` when the model's tensor-parallel plan splits it by
    vocabulary (a ``colwise`` style), it is not tied to the input embedding, and ``ranks`` divides the vocabulary.
    Returns whether it did."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, nn.Linear) or head.out_features % ranks:
        return False
    get_input = getattr(model, "get_input_embeddings", None)
    embedding = get_input() if callable(get_input) else None
    if embedding is not None and getattr(embedding, "weight", None) is head.weight:
        return False
    name = next((name for name, module in model.named_modules() if module is head), None)
    plan = {**(getattr(type(model), "_tp_plan", None) or {}), **(getattr(model, "_tp_plan", None) or {})}
    if name is None or not str(plan.get(name, "")).startswith("colwise"):
        return False
    parent_name, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, attribute, GatheredHead(head, ranks))
    return True
