"""``MegatronLMPlugin`` on hasten's torch-native engine: Megatron-style tensor / pipeline / data parallelism.

``Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2, ...))`` (or ``distributed_type: MEGATRON_LM`` in a
config file) trains the user's own model with the model-parallel engine of ``strategies/model_parallel/strategy.py``:

- ``tp_degree`` / ``pp_degree`` become the ``tp`` / ``pp`` mesh dimensions and the remaining processes are data
  parallel: FSDP2-sharded with ``use_distributed_optimizer`` (parameters, gradients and optimizer state split over
  them, as Megatron's distributed optimizer splits the optimizer state), replicated otherwise;
- the tensor-parallel plan is the model's (``_tp_plan`` / ``config.base_model_tp_plan``) or a ParallelismConfig's
  ``tp_handler``; ``sequence_parallelism=True`` asks that plan to contain sequence-parallel entries;
- ``recompute_activations`` checkpoints the transformer blocks (``recompute_method="block"``: only the first
  ``recompute_num_layers`` of them), between tensor parallelism and sharding;
- ``gradient_clipping`` (default 1.0, 0 turns it off) clips the global gradient norm, reduced over every mesh
  dimension, before each optimizer step, as Megatron does;
- with ``pp_degree > 1``, ``num_micro_batches`` micro-batches go through a 1F1B pipeline and
  ``custom_loss_function(outputs, target)`` computes each micro-batch's loss on the last stage.

Fields that only Megatron-LM itself can honour are refused by ``megatron_mapping.check_torch_native``, by name.
``AcceleratorState.distributed_type`` is ``MEGATRON_LM``, as scripts written for Accelerate expect.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from torch import nn

from ...config.enums import DistributedType
from ..single import SingleDeviceStrategy
from .megatron_mapping import check_torch_native, megatron_layout
from .strategy import ModelParallelStrategy

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

    from ...config.accelerator_settings import AcceleratorSettings
    from ...config.megatron import MegatronLMPlugin
    from ...parallel import ParallelDims
    from ...state import PartialState

__all__ = ["MegatronLMStrategy", "MegatronLMSingleDeviceStrategy", "megatron_strategy", "transformer_blocks"]


def transformer_blocks(model: nn.Module) -> list:
    """The model's repeated blocks: modules of the classes in ``model._no_split_modules`` (transformers'
    convention), else the members of its ``nn.ModuleList``s."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    if names:
        found = [m for m in model.modules() if type(m).__name__ in names and m is not model]
        if found:
            return found
    return [block for module in model.modules() if isinstance(module, nn.ModuleList) for block in module]


class _MegatronOptions:
    """The plugin's training options that apply on any layout: recomputation and gradient clipping."""

    megatron_plugin = None

    def _recompute(self, module) -> None:
        """Activation checkpointing of the transformer blocks (``recompute_activations``)."""
        plugin = self.megatron_plugin
        if not plugin.recompute_activations:
            return
        from ..fsdp.wrapping import apply_activation_checkpointing

        blocks = transformer_blocks(module)
        if not blocks:
            raise ValueError(f"MegatronLMPlugin(recompute_activations=True) found no transformer blocks in the "
                             f"{type(module).__name__}: list their classes in model._no_split_modules, or keep the "
                             "blocks in an nn.ModuleList.")
        if plugin.recompute_method == "block":
            blocks = blocks[:plugin.recompute_num_layers]
        apply_activation_checkpointing(module, blocks)

    def _clip_before_each_step(self, optimizer):
        """Clip the global gradient norm to ``gradient_clipping`` before each step of ``optimizer`` (0: never)."""
        max_norm = self.megatron_plugin.gradient_clipping
        if max_norm:
            def clip(inner, args, kwargs):
                self.clip_grad_norm_([p for group in inner.param_groups for p in group["params"]], max_norm)

            optimizer.register_step_pre_hook(clip)
        return optimizer

    def note_data_loader(self, data_loader: DataLoader) -> None:
        """The first loader's batch size gives the plugin's ``micro_batch_size`` / ``global_batch_size`` (as
        Accelerate's ``set_training_args``; scripts read ``global_batch_size``). Under a pipeline the loader's
        batch is cut into ``num_micro_batches``."""
        plugin = self.megatron_plugin
        batch_size = getattr(data_loader, "batch_size", None)
        if batch_size is None or getattr(plugin, "micro_batch_size", None) is not None:
            return
        # without a pipeline num_micro_batches is 1 (check_torch_native refuses more)
        plugin.set_training_args(batch_size // plugin.num_micro_batches, plugin.data_parallel_size)

    def state_views(self) -> dict:
        # what scripts written for Accelerate check
        return {**super().state_views(), "distributed_type": DistributedType.MEGATRON_LM,
                "megatron_lm_plugin": self.megatron_plugin}

    def _record(self, data_parallel_size: int) -> None:
        plugin = self.megatron_plugin
        plugin.data_parallel_size = data_parallel_size
        plugin.megatron_lm_default_args["data_parallel_size"] = data_parallel_size


class MegatronLMStrategy(_MegatronOptions, ModelParallelStrategy):
    """The model-parallel engine laid out and configured by a ``MegatronLMPlugin``."""

    needs_model_parallel_layout = False  # tp_degree = pp_degree = 1 is Megatron's plain data parallelism

    def __init__(self, processes: PartialState, settings: Optional[AcceleratorSettings] = None,
                 dims: Optional[ParallelDims] = None, plugin: Optional[MegatronLMPlugin] = None):
        from ...config.fsdp import FullyShardedDataParallelPlugin
        from ...parallel.config import TorchPipelineParallelConfig

        layout = megatron_layout(plugin, processes.num_processes, dims)
        config = getattr(layout, "_config", None)
        pp_config = getattr(config, "pp_handler", None)
        if layout.pp > 1 and pp_config is None:
            pp_config = TorchPipelineParallelConfig(num_micro_batches=plugin.num_micro_batches,
                                                    loss_fn=plugin.custom_loss_function)
        self.megatron_plugin = plugin
        super().__init__(processes, settings, layout, FullyShardedDataParallelPlugin(fsdp_version=2),
                         tp_plan=getattr(getattr(config, "tp_handler", None), "tp_plan", None), pp_config=pp_config)

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.MEGATRON_LM

    def setup(self) -> None:
        super().setup()
        self._record(self.layout.dp_size)

    def _plan_for(self, model):
        plan = super()._plan_for(model)
        if self.megatron_plugin.sequence_parallelism and not _has_sequence_parallel(plan):
            raise ValueError(
                f"MegatronLMPlugin(sequence_parallelism=True) needs a tensor-parallel plan with sequence-parallel "
                f"entries for the norms (style 'sequence_parallel') and the blocks' inputs and outputs sharded on the "
                f"sequence dimension; the {type(model).__name__}'s plan has none: give one with ParallelismConfig("
                "tp_handler=TorchTensorParallelConfig(tp_plan=...)), or set sequence_parallelism=False.")
        return plan

    def _after_tensor_parallel(self, module) -> None:
        self._recompute(module)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return self._clip_before_each_step(super().prepare_optimizer(optimizer))

    def __repr__(self) -> str:
        layout = self.layout
        return (f"MegatronLMStrategy(pp={layout.pp}, tp={layout.tp}, dp_shard={layout.dp_shard}, dp_replicate="
                f"{layout.dp_replicate}, processes={self.processes.num_processes})")


class MegatronLMSingleDeviceStrategy(_MegatronOptions, SingleDeviceStrategy):
    """A ``MegatronLMPlugin`` on one process (tp_degree = pp_degree = 1): recomputation and clipping only."""

    def __init__(self, processes: PartialState, settings: Optional[AcceleratorSettings] = None,
                 dims: Optional[ParallelDims] = None, plugin: Optional[MegatronLMPlugin] = None):
        megatron_layout(plugin, 1, dims)  # tp or pp > 1 on one process: the error says how many to launch
        self.megatron_plugin = plugin
        super().__init__(processes, settings, dims)

    distributed_type = DistributedType.MEGATRON_LM

    def setup(self) -> None:
        super().setup()
        self._record(1)

    def prepare_model(self, model: nn.Module, device_placement: bool = True,
                      evaluation_mode: bool = False) -> nn.Module:
        model = super().prepare_model(model, device_placement, evaluation_mode)
        self._recompute(model)
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return self._clip_before_each_step(super().prepare_optimizer(optimizer))


def megatron_strategy(processes: PartialState, settings: Optional[AcceleratorSettings] = None,
                      dims: Optional[ParallelDims] = None, plugin: Optional[MegatronLMPlugin] = None,
                      ) -> Union[MegatronLMStrategy, MegatronLMSingleDeviceStrategy]:
    """The strategy for a ``MegatronLMPlugin`` (None: one read from the launcher's environment), after checking
    that the torch-native engine honours every field it sets."""
    from ...config.megatron import MegatronLMPlugin

    plugin = plugin if plugin is not None else MegatronLMPlugin()
    if not isinstance(plugin, MegatronLMPlugin):
        raise TypeError(f"megatron_lm_plugin must be a MegatronLMPlugin, got {type(plugin).__name__}.")
    check_torch_native(plugin)
    if processes.num_processes == 1:
        return MegatronLMSingleDeviceStrategy(processes, settings, dims, plugin)
    return MegatronLMStrategy(processes, settings, dims, plugin)


def _has_sequence_parallel(plan) -> bool:
    from torch.distributed.tensor.parallel import SequenceParallel

    return any(style == "sequence_parallel" or isinstance(style, SequenceParallel) for style in (plan or {}).values())
