"""Tensor parallelism on DTensor, composed with FSDP2 over the data-parallel dimensions (the torch-native engine).

A ``ParallelismConfig(tp_size=N, ...)`` (or ``TorchTensorParallelPlugin(tp_size=N)``) selects it. Each prepared
model is split in torchtitan's order:

1. **tensor parallelism**: the plan (``TorchTensorParallelConfig(tp_plan=...)``, else the model's ``_tp_plan``, else
   its config's ``base_model_tp_plan``; see ``model_parallel/tp_plan.py``) applied with ``parallelize_module`` over the
   ``tp`` mesh dimension. A model whose parameters are DTensors already (transformers'
   ``from_pretrained(tp_plan="auto")``) is taken as it is;
2. activation checkpointing and compilation, as the FSDP plugin and the run ask (with tensor parallelism alone, no
   data-parallel sharding, the plugin's ``activation_checkpointing`` is applied all the same);
3. **data parallelism** with ``fully_shard`` over the data-parallel dimensions of the same mesh: FSDP x TP
   (``dp_shard``), HSDP x TP (``dp_replicate`` and ``dp_shard``), and DDP x TP, which is HSDP with one rank per
   shard group (every rank holds the whole of its tp shard; gradients are averaged over ``dp_replicate``).

Data is split over the data-parallel ranks only (the ranks of one tp group see the same batch), gathers count each
sample once, clipping reduces the norm over every mesh dimension, and checkpoints are DCP shards that load under
another layout (saved with TP=2, loaded with TP=1 or on one process).

With ``pp_size > 1`` (pipeline parallelism, ``torch.distributed.pipelining``) the model is first cut into stages
(``model_parallel/pipeline.py``); each rank keeps its stages, splits them over ``tp`` as above, shards each with
FSDP2 over the data-parallel dimensions when there are several, and the prepared model is a ``PipelineModel``
(``model_parallel/pipeline_model.py``): ``loss = model(inputs, target)`` trains one batch, micro-batch by
micro-batch. Gradient norms are summed over the pipeline ranks; checkpoints are DCP shards (each rank writes its
stages), which load under another layout.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Optional, Sequence, Union

import torch
from torch import nn

from ...config.enums import DistributedType
from ..fsdp.fsdp2 import FSDP2Strategy, _repoint
from ..fsdp.sharding import shard_options
from ..fsdp.wrapping import apply_activation_checkpointing, wrap_policy, wrap_units
from .mixed_parameters import per_tensor_where_mixed
from .tp_plan import apply_plan, is_tensor_parallel, plan_of, resolve_plan, splits_the_logits

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ...config.accelerator_settings import AcceleratorSettings
    from ...config.fsdp import FullyShardedDataParallelPlugin
    from ...parallel import ParallelDims
    from ...parallel.config import TorchPipelineParallelConfig
    from ...state import PartialState

__all__ = ["ModelParallelStrategy"]


class ModelParallelStrategy(FSDP2Strategy):
    """Splits each model over the ``tp`` dimension, then shards or replicates it over the data-parallel ones."""

    needs_model_parallel_layout = True  # a layout with tp or pp > 1 (a subclass may run data parallelism alone)

    def __init__(self, processes: PartialState, settings: Optional[AcceleratorSettings] = None,
                 dims: Optional[ParallelDims] = None, plugin: Optional[FullyShardedDataParallelPlugin] = None,
                 tp_plan: Optional[dict] = None, pp_config: Optional[TorchPipelineParallelConfig] = None):
        from ...core.planned import not_yet_supported

        if self.needs_model_parallel_layout and (dims is None or (dims.tp == 1 and dims.pp == 1)):
            raise ValueError("ModelParallelStrategy needs a layout with tp_size or pp_size > 1: "
                             "ParallelismConfig(tp_size=N) or ParallelismConfig(pp_size=N).")
        if dims.cp > 1 and dims.pp > 1:
            raise not_yet_supported(f"context parallelism with pipeline parallelism (cp_size={dims.cp}, pp_size="
                                    f"{dims.pp})", "use context parallelism with tensor and data parallelism")
        if dims.dp_replicate > 1 and dims.dp_shard == 1:
            dims.unit_dims = ("dp_shard",)  # DDP x TP: FSDP2 over (dp_replicate, a one-rank dp_shard)
        super().__init__(processes, settings, dims, plugin)
        self.tp_plan = tp_plan
        self.splits_logits = False  # a "loss_parallel" head: the loss runs on logits split over the classes
        if dims.pp > 1:
            from ...parallel.config import TorchPipelineParallelConfig

            self.pp_config = pp_config or TorchPipelineParallelConfig()
            from ...checkpointing.sharded_io import ShardedCheckpointIO

            if not isinstance(self.checkpoint_io, ShardedCheckpointIO):
                raise ValueError("Pipeline parallelism saves each rank's stages as DCP shards: use the FSDP plugin's "
                                 "default state_dict_type (SHARDED_STATE_DICT), not full-state files.")

    @property
    def distributed_type(self) -> DistributedType:
        """FSDP when the data-parallel dimensions shard or replicate through FSDP2, else the process state's."""
        return DistributedType.FSDP if self._sharded_over_data else self.processes.distributed_type

    @property
    def _sharded_over_data(self) -> bool:
        """Whether FSDP2 runs over ``dp_shard x cp`` (and ``dp_replicate``): several data-parallel or context-parallel
        ranks, whose gradients it averages."""
        return self.layout.dp_size * self.layout.cp > 1

    def setup(self) -> None:
        if self._sharded_over_data:
            super().setup()

    # ------------------------------------------------------------ pipeline parallelism
    def prepare_training(self, models: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
                         device_placement: Sequence[bool], evaluation_mode: bool = False,
                         compile_model: Optional[Callable[[nn.Module], nn.Module]] = None,
                         **context: Any) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        if self.layout.pp == 1:
            return super().prepare_training(models, optimizers, device_placement, evaluation_mode, compile_model,
                                            **context)
        from ...checkpointing.optimizer_names import clean_name

        if context.get("accumulation_steps", 1) > 1:
            raise ValueError("Pipeline parallelism accumulates gradients over its micro-batches: use "
                             "TorchPipelineParallelConfig(num_micro_batches=...) instead of gradient_accumulation_steps "
                             f"({context['accumulation_steps']}).")
        if self.pp_config.loss_fn is None and optimizers:
            raise ValueError("Pipeline parallelism computes the loss on the last stage: give it, ParallelismConfig("
                             "pp_size=N, pp_handler=TorchPipelineParallelConfig(loss_fn=lambda outputs, target: ...)).")
        originals, prepared = {}, []
        for model, place in zip(models, device_placement):
            if place:
                model = model.to(self.processes.device)
            originals.update({id(p): clean_name(n) for n, p in model.named_parameters()})
            prepared.append(self.precision.wrap_forward(self._pipeline(model)))
        local = {clean_name(n): p for model in prepared for n, p in self.unwrap(model).named_parameters()}
        for optimizer in optimizers:  # this rank's parameters only: the others are other stages'
            for group in optimizer.param_groups:
                group["params"] = [p for p in group["params"] if originals.get(id(p)) in local]
            self._optimizer_names[id(optimizer)] = [[originals[id(p)] for p in group["params"]]
                                                    for group in optimizer.param_groups]
            _repoint(optimizer, originals, local)
        return prepared, [self.prepare_optimizer(o) for o in optimizers]

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Groups that mix DTensors and plain tensors step tensor by tensor (``mixed_parameters.py``)."""
        return per_tensor_where_mixed(super().prepare_optimizer(optimizer))

    def _pipeline(self, model):
        """Cut ``model`` into stages, keep this rank's (split over tp), and the schedule that runs them."""
        from .pipeline import PipelineStageModule, build_pipeline, split_model
        from .pipeline_model import PipelineModel

        layout, config = self.layout, self.pp_config
        layout.build_mesh(self.processes.device.type)
        stages = split_model(model, layout.pp * config.virtual_stages, config.split_points)
        mine = [index for index in range(layout.pp_rank, len(stages), layout.pp)]
        part = PipelineStageModule(model, [name for index in mine for name in stages[index].unit_names], -1)
        if layout.tp > 1:
            plan = self._plan_for(model)
            if plan is None:
                raise ValueError(f"The {type(model).__name__} has no tensor-parallel plan: give one, "
                                 "TorchTensorParallelConfig(tp_plan={...}).")
            names = set(dict(part.named_modules()))
            here = {name: style for name, style in resolve_plan(model, plan, layout.tp).items() if name in names}
            self.splits_logits = self.splits_logits or splits_the_logits(here)
            if here:
                apply_plan(part, here, layout.submesh("tp"))
        self._after_tensor_parallel(part)
        if layout.dp_size > 1:  # PP x FSDP (x TP): each of this rank's stages sharded over the data-parallel dims
            from torch.distributed.fsdp import fully_shard

            options = shard_options(self.plugin, layout.fsdp_mesh(self.processes.device.type))
            for index in mine:
                fully_shard(stages[index], **options)
        pipeline = build_pipeline(stages, layout.pp_rank, layout.submesh("pp"), schedule=config.schedule,
                                  num_micro_batches=config.num_micro_batches or layout.pp * config.virtual_stages,
                                  loss_fn=config.loss_fn, virtual_stages=config.virtual_stages)
        return PipelineModel(part, pipeline, layout.submesh("pp").get_group())

    def loss_parallel(self) -> Optional[ContextManager]:
        """torch's ``loss_parallel`` context when a prepared model's head splits the logits over the classes."""
        if not self.splits_logits:
            return None
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def backward(self, loss: torch.Tensor, model: Optional[nn.Module] = None, *, accumulation_steps: int = 1,
                 num_items_in_batch: Optional[Union[int, torch.Tensor]] = None, sync_gradients: bool = True,
                 **kwargs: Any) -> None:
        """Under pipeline parallelism the schedule ran the backward when the model was called: nothing to do.
        With a loss-parallel head, the backward runs in torch's ``loss_parallel`` context, as it must."""
        if self.layout.pp > 1:
            if num_items_in_batch is not None:
                raise ValueError("num_items_in_batch does not apply under pipeline parallelism: the loss_fn gives the "
                                 "mean loss of each micro-batch.")
            return
        with self.loss_parallel() or contextlib.nullcontext():
            super().backward(loss, model, accumulation_steps=accumulation_steps,
                             num_items_in_batch=num_items_in_batch, sync_gradients=sync_gradients, **kwargs)

    def unwrap(self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> nn.Module:
        from .pipeline_model import PipelineModel

        unwrapped = super().unwrap(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile)
        return unwrapped.module if isinstance(unwrapped, PipelineModel) else unwrapped

    def total_grad_norm(self, parameters: Iterable[torch.Tensor], norm_type: float = 2,
                        ) -> tuple[dict[Optional[DeviceMesh], list[torch.Tensor]], Optional[torch.Tensor]]:
        """Under pipeline parallelism, each rank's norm covers its stages: combined over the pipeline ranks."""
        groups, total = super().total_grad_norm(parameters, norm_type)
        if self.layout.pp == 1:
            return groups, total
        import torch.distributed as dist

        group = self.layout.submesh("pp").get_group()
        local = torch.zeros((), dtype=torch.float32) if total is None else total.detach().float().cpu()
        if float(norm_type) == float("inf"):
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
            combined = local
        else:
            power = local ** norm_type
            dist.all_reduce(power, group=group)
            combined = power ** (1.0 / norm_type)
        device = total.device if total is not None else torch.device("cpu")
        return groups, combined.to(device)

    def model_state_dict(self, model: nn.Module, full: bool = True) -> dict:
        """Full under pipeline parallelism: every rank's stages, gathered (on every rank)."""
        if self.layout.pp == 1 or not full:
            return super().model_state_dict(model, full)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # each rank's own stages whole (tp shards gathered), on every rank: cpu_offload would keep them on rank 0
        state = get_model_state_dict(self._state_dict_module(model), options=StateDictOptions(full_state_dict=True))
        return self._from_every_stage({k: v.detach().cpu() for k, v in state.items()})

    def _from_every_stage(self, part: dict) -> dict:
        """The union of every pipeline rank's ``part`` (picklable values), on every rank."""
        import torch.distributed as dist

        everyone = [None] * self.layout.pp
        dist.all_gather_object(everyone, part, group=self.layout.submesh("pp").get_group())
        merged = {}
        for piece in everyone:
            merged.update(piece)
        return merged

    def expected_state_dict(self, model: nn.Module, keep_vars: bool = False) -> dict:
        """Every name of the whole model (all stages), each with a tensor of its full shape."""
        local = super().expected_state_dict(model, keep_vars)
        if self.layout.pp == 1:
            return local
        shapes = self._from_every_stage({k: (tuple(v.shape), v.dtype) for k, v in local.items()})
        return {k: torch.empty(shape, dtype=dtype, device="meta") for k, (shape, dtype) in shapes.items()}

    def load_model_state_dict(self, model: nn.Module, state_dict: dict, strict: bool = True) -> Optional[tuple]:
        """A whole model's state: this rank's stages take their part."""
        if self.layout.pp > 1:
            names = set(self.unwrap(model).state_dict().keys())
            state_dict = {k: v for k, v in state_dict.items() if k in names}
        return super().load_model_state_dict(model, state_dict, strict)

    def shard_model(self, model: nn.Module) -> nn.Module:
        """Apply the tensor-parallel plan, then FSDP2 over the data-parallel dimensions (when there are several)."""
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            return model
        layout = self.layout
        layout.build_mesh(self.processes.device.type)
        if layout.tp > 1 and not is_tensor_parallel(model):
            plan = self._plan_for(model)
            if plan is None:
                raise ValueError(
                    f"The {type(model).__name__} has no tensor-parallel plan (no _tp_plan, no config.base_model_tp_plan): "
                    "give one, ParallelismConfig(tp_size=N, tp_handler=TorchTensorParallelConfig(tp_plan={'layers.*."
                    "fc1': 'colwise', 'layers.*.fc2': 'rowwise'})), naming the model's modules.")
            resolved = resolve_plan(model, plan, layout.tp)
            self.splits_logits = self.splits_logits or splits_the_logits(resolved)
            apply_plan(model, resolved, layout.submesh("tp"))
        self._after_tensor_parallel(model)
        if not self._sharded_over_data:  # no FSDP2 to apply the plugin's activation checkpointing: done here
            plugin = self.plugin
            if plugin.activation_checkpointing:
                apply_activation_checkpointing(model, wrap_units(model, wrap_policy(model, plugin)),
                                               offload=plugin.activation_checkpointing_offload)
            return model
        return super().shard_model(model)

    def _plan_for(self, model) -> dict:
        """The tensor-parallel plan for ``model`` (None: it has none)."""
        return plan_of(model, self.tp_plan)

    def _after_tensor_parallel(self, module) -> None:
        """A step between tensor parallelism and data-parallel sharding (torchtitan's order); none here."""

    def __repr__(self) -> str:
        layout = self.layout
        return (f"ModelParallelStrategy(pp={layout.pp}, tp={layout.tp}, dp_shard={layout.dp_shard}, dp_replicate="
                f"{layout.dp_replicate}, processes={self.processes.num_processes})")
