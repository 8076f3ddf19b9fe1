"""Tensor parallelism on DTensor, composed with FSDP2 over the data-parallel dimensions (the torch-native engine).

A ``ParallelismConfig(tp_size=N, ...)`` (or ``TorchTensorParallelPlugin(tp_size=N)``) selects it. Each prepared
model is split in torchtitan's order:

1. **tensor parallelism**: the plan (``TorchTensorParallelConfig(tp_plan=...)``, else the model's ``_tp_plan``, else
   its config's ``base_model_tp_plan``; see ``parallel/tp_plan.py``) applied with ``parallelize_module`` over the
   ``tp`` mesh dimension. A model whose parameters are DTensors already (transformers'
   ``from_pretrained(tp_plan="auto")``) is taken as it is;
2. activation checkpointing and compilation, as the FSDP plugin and the run ask;
3. **data parallelism** with ``fully_shard`` over the data-parallel dimensions of the same mesh: FSDP x TP
   (``dp_shard``), HSDP x TP (``dp_replicate`` and ``dp_shard``), and DDP x TP, which is HSDP with one rank per
   shard group (every rank holds the whole of its tp shard; gradients are averaged over ``dp_replicate``).

Data is split over the data-parallel ranks only (the ranks of one tp group see the same batch), gathers count each
sample once, clipping reduces the norm over every mesh dimension, and checkpoints are DCP shards that load under
another layout (saved with TP=2, loaded with TP=1 or on one process).
"""
from __future__ import annotations

from ..config.enums import DistributedType
from ..parallel.tp_plan import apply_plan, is_tensor_parallel, plan_of, resolve_plan
from .fsdp import FSDPStrategy

__all__ = ["ModelParallelStrategy"]


class ModelParallelStrategy(FSDPStrategy):
    """Splits each model over the ``tp`` dimension, then shards or replicates it over the data-parallel ones."""

    def __init__(self, state, kwargs_handlers=None, dims=None, plugin=None, tp_plan=None):
        from ..utils.planned import not_yet_supported

        if dims is None or dims.tp == 1:
            raise ValueError("ModelParallelStrategy needs a layout with tp_size > 1: ParallelismConfig(tp_size=N).")
        if dims.cp > 1:
            raise not_yet_supported(f"context parallelism (ParallelismConfig cp_size={dims.cp})",
                                    "use tensor parallelism (tp_size) and data parallelism meanwhile")
        if dims.dp_replicate > 1 and dims.dp_shard == 1:
            dims.unit_dims = ("dp_shard",)  # DDP x TP: FSDP2 over (dp_replicate, a one-rank dp_shard)
        super().__init__(state, kwargs_handlers, dims, plugin)
        self.tp_plan = tp_plan

    @property
    def distributed_type(self):
        """FSDP when the data-parallel dimensions shard or replicate through FSDP2, else the process state's."""
        return DistributedType.FSDP if self.layout.dp_size > 1 else self.state.distributed_type

    def setup(self) -> None:
        if self.layout.dp_size > 1:
            super().setup()

    def shard_model(self, model):
        """Apply the tensor-parallel plan, then FSDP2 over the data-parallel dimensions (when there are several)."""
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            return model
        layout = self.layout
        layout.build_mesh(self.state.device.type)
        if not is_tensor_parallel(model):
            plan = plan_of(model, self.tp_plan)
            if plan is None:
                raise ValueError(
                    f"The {type(model).__name__} has no tensor-parallel plan (no _tp_plan, no config.base_model_tp_plan): "
                    "give one, ParallelismConfig(tp_size=N, tp_handler=TorchTensorParallelConfig(tp_plan={'layers.*."
                    "fc1': 'colwise', 'layers.*.fc2': 'rowwise'})), naming the model's modules.")
            apply_plan(model, resolve_plan(model, plan, layout.tp), layout.submesh("tp"))
        if layout.dp_size == 1:
            return model
        return super().shard_model(model)

    def __repr__(self) -> str:
        layout = self.layout
        return (f"ModelParallelStrategy(tp={layout.tp}, dp_shard={layout.dp_shard}, dp_replicate={layout.dp_replicate}, "
                f"processes={self.state.num_processes})")
