"""``PipelineModel``: the prepared model under pipeline parallelism (``ParallelismConfig(pp_size=...)``).

Each rank holds its stages of the model (``module``: those parts, under the names they have in the whole model, so
state dicts, optimizers and checkpoints see the model's own names) and a pipeline schedule that runs them
(``strategies/model_parallel/pipeline.py``). Called as a model:

- training (``model.train()``): ``loss = model(inputs, target)`` runs the forward and the backward of every
  micro-batch (the loss is computed on the last stage with the config's ``loss_fn``) and returns the mean loss on
  every rank of the pipeline; ``accelerator.backward(loss)`` then has nothing left to do, and the prepared optimizer
  steps this rank's parameters;
- evaluation (``model.eval()``): ``outputs = model(inputs)`` runs the forward pass and returns the last stage's
  outputs on every rank of the pipeline (sent from the last stage), so evaluation loops and ``gather_for_metrics``
  run unchanged.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from .pipeline import PipelineSchedule

__all__ = ["PipelineModel"]


class PipelineModel(nn.Module):
    """This rank's stages of a model and the schedule that runs them (see the module docstring)."""

    def __init__(self, module: nn.Module, pipeline: PipelineSchedule, group: Optional[ProcessGroup]):
        super().__init__()
        self.module = module
        self.__dict__["pipeline"] = pipeline  # not a submodule: its stages are module's parts
        self.__dict__["group"] = group

    def forward(self, inputs: Optional[torch.Tensor] = None,
                target: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        if self.training:
            if self.pipeline.is_last and target is None:
                raise ValueError("Under pipeline parallelism the model computes the loss itself, on the last stage: "
                                 "call it as loss = model(inputs, target) while training (model.eval() for outputs).")
            return self.pipeline.step(inputs, target)
        outputs = self.pipeline.eval_step(inputs)
        return self._from_last_stage(outputs)

    def _from_last_stage(self, outputs):
        import torch.distributed as dist

        if self.pipeline.pp_size == 1:
            return outputs
        box = [outputs.cpu() if outputs is not None else None]
        dist.broadcast_object_list(box, src=self.pipeline._last_rank, group=self.group)
        device = next(self.module.parameters(), torch.empty(0)).device
        return box[0].to(device)

    def extra_repr(self) -> str:
        return f"stages={self.pipeline.stage_indices}, schedule={self.pipeline.schedule_name!r}"
