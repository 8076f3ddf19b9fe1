"""One rank's output layer and input embedding under tensor parallelism, for the narrowed model the planner traces.

Transformers' causal-LM plans split both ends of the model by vocabulary: the output layer (``"lm_head":
"colwise_gather_output"``: each rank holds ``vocab / t`` rows of the weight, computes its share of the logits and
gathers the whole logits from the others) and the input embedding (``"embed_tokens": "embedding_rowwise"``: each
rank holds ``vocab / t`` rows, looks up the ids that fall in them and sums the lookups of every rank into the whole
embedding). ``narrow_vocabulary`` puts a ``GatheredHead`` and a ``SummedEmbedding`` in their places on a model built
narrowed by ``t`` (``model_source.py``) when the model's plan (``strategies/model_parallel/tp_plan.plan_of``, the one
the strategy applies) splits them, so that the trace holds what one rank holds: the weights' shares (and their
gradients and optimizer state), the local results and the gathered or summed whole.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

__all__ = ["GatheredHead", "SummedEmbedding", "narrow_vocabulary"]


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


class SummedEmbedding(nn.Module):
    """``vocab / ranks`` rows of an input embedding; its output is the whole embedding of the ids, as the sum of
    every rank's lookup (a new tensor, as the all-reduce returns it)."""

    def __init__(self, embedding: nn.Embedding, ranks: int):
        super().__init__()
        self.share = nn.Embedding(embedding.num_embeddings // ranks, embedding.embedding_dim,
                                  device=embedding.weight.device, dtype=embedding.weight.dtype)

    @property
    def weight(self) -> torch.Tensor:
        return self.share.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = self.share(ids.remainder(self.share.num_embeddings))  # the ids in this rank's rows
        return local.clone()  # the sum over the ranks


def _style(plan: dict, model: nn.Module, module: Optional[nn.Module]) -> str:
    name = next((name for name, candidate in model.named_modules() if candidate is module), None)
    return str(plan.get(name, "")) if name is not None else ""


def _replace(model: nn.Module, module: nn.Module, replacement: nn.Module) -> None:
    name = next(name for name, candidate in model.named_modules() if candidate is module)
    parent_name, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, attribute, replacement)


def narrow_vocabulary(model: nn.Module, ranks: int) -> list[str]:
    """Replace ``model``'s output layer by its ``GatheredHead`` and its input embedding by its ``SummedEmbedding``
    where the model's tensor-parallel plan splits them by vocabulary (``colwise`` styles for the head, ``rowwise``
    ones for the embedding), they are not tied to each other, and ``ranks`` divides the vocabulary. Returns which
    (``"head"``, ``"embedding"``)."""
    from ..strategies.model_parallel.tp_plan import plan_of

    plan = plan_of(model) or {}
    get_head, get_input = getattr(model, "get_output_embeddings", None), getattr(model, "get_input_embeddings", None)
    head = get_head() if callable(get_head) else None
    embedding = get_input() if callable(get_input) else None
    if head is not None and embedding is not None and getattr(embedding, "weight", None) is head.weight:
        return []  # tied: one weight, which the plan cannot split two ways
    narrowed = []
    if isinstance(head, nn.Linear) and not head.out_features % ranks and \
            _style(plan, model, head).startswith("colwise"):
        _replace(model, head, GatheredHead(head, ranks))
        narrowed.append("head")
    if isinstance(embedding, nn.Embedding) and not embedding.num_embeddings % ranks and \
            "rowwise" in _style(plan, model, embedding):
        _replace(model, embedding, SummedEmbedding(embedding, ranks))
        narrowed.append("embedding")
    return narrowed
