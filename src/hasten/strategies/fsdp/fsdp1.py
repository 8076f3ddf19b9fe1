"""FSDP1: ``torch.distributed.fsdp.FullyShardedDataParallel``, the wrapper-module FSDP (``fsdp_version=1``).

Everything but the wrapping is shared with FSDP2 (``fsdp.py``): layout, precision (with a sharded grad scaler),
the state dicts through ``torch.distributed.checkpoint.state_dict`` (which serves both versions), checkpoint IO.
Here: the plugin's FSDP1 options go to the wrapper (sharding strategy, backward / forward prefetch, CPU offload,
mixed precision, auto-wrap policy, ignored modules, ``sync_module_states`` + ``param_init_fn``,
``limit_all_gathers``, ``use_orig_params``); on the CPU the wrapper is told its device (``device_id=cpu``).

``sync_module_states=True`` (transformers' default) needs a GPU in torch's FSDP1; on the CPU the same thing is done
before wrapping: modules on the meta device are materialised with ``param_init_fn``, then every parameter and
buffer is broadcast from rank 0 (``torch.distributed.utils._sync_module_states``, DDP's own).
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, Sequence

from torch import nn

from .fsdp2 import FSDP2Strategy
from .wrapping import apply_activation_checkpointing, ignored_submodules, wrap_policy, wrap_units

if TYPE_CHECKING:
    import torch

    from ...config.accelerator_settings import AcceleratorSettings
    from ...config.fsdp import FullyShardedDataParallelPlugin
    from ...parallel import ParallelDims
    from ...state import PartialState

__all__ = ["FSDP1Strategy", "wrapper_options"]


def wrapper_options(plugin: FullyShardedDataParallelPlugin, decide: Optional[Callable[[nn.Module, int], bool]],
                    device: torch.device) -> dict:
    """``FullyShardedDataParallel``'s options from the plugin: its sharding strategy, CPU offload, backward and
    forward prefetch, mixed precision, ``param_init_fn`` and ``sync_module_states``, ``limit_all_gathers``,
    ``use_orig_params``, the units ``decide`` picks (``wrapping.wrap_policy``), and the device (on the CPU the device
    itself). ``shard_model`` wraps with them; the planner (``planning/fsdp1_memory.py``) traces with them."""
    return dict(
        sharding_strategy=plugin.sharding_strategy, cpu_offload=plugin.cpu_offload,
        auto_wrap_policy=(lambda module, recurse, nonwrapped_numel: True if recurse
                          else decide(module, nonwrapped_numel)) if decide is not None else None,
        backward_prefetch=plugin.backward_prefetch, mixed_precision=plugin.mixed_precision_policy,
        param_init_fn=plugin.param_init_fn, sync_module_states=bool(plugin.sync_module_states),
        forward_prefetch=bool(plugin.forward_prefetch), limit_all_gathers=plugin.limit_all_gathers,
        use_orig_params=bool(plugin.use_orig_params),
        device_id=device if device.type == "cpu" else device.index,
    )


class FSDP1Strategy(FSDP2Strategy):
    """Wraps every prepared model in ``FullyShardedDataParallel`` over the data-parallel shard group."""

    fsdp_version = 1

    def __init__(self, processes: PartialState, settings: Optional[AcceleratorSettings] = None,
                 dims: Optional[ParallelDims] = None, plugin: Optional[FullyShardedDataParallelPlugin] = None):
        offload = getattr(getattr(plugin, "cpu_offload", None), "offload_params", False)
        if offload and processes.device.type == "cpu":
            raise ValueError(
                "FSDP1 with cpu_offload=True cannot run on the CPU: torch's FSDP1 offload pins the shards for a GPU "
                "and fails without one, and on the CPU the parameters are in CPU memory already. Remove cpu_offload "
                "(FSDP_OFFLOAD_PARAMS=false), or use fsdp_version=2, whose CPU offload works here.")
        super().__init__(processes, settings, dims, plugin)
        self._layouts: dict = {}  # id(user's module) -> its full state dict's names, on meta (see expected_state_dict)

    def expected_state_dict(self, model: nn.Module, keep_vars: bool = False) -> dict:
        """The full names and shapes, recorded before wrapping (the wrapped module lists its flat parameters)."""
        layout = self._layouts.get(id(self.unwrap(model)))
        return dict(layout) if layout is not None else super().expected_state_dict(model, keep_vars)

    def shard_model(self, model: nn.Module) -> nn.Module:
        """Wrap ``model`` in ``FullyShardedDataParallel`` (with nested units) and return the wrapper."""
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

        if isinstance(model, FullyShardedDataParallel):
            return model
        decide = wrap_policy(model, self.plugin)
        units = wrap_units(model, decide)
        layout = self.layout
        layout.build_mesh(self.processes.device.type)
        hybrid = layout.dp_replicate > 1
        strategy = self.plugin.sharding_strategy
        if hybrid and strategy not in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2):
            strategy = ShardingStrategy.HYBRID_SHARD  # dp_replicate x dp_shard: shard within, replicate across
        options = wrapper_options(self.plugin, decide, self.processes.device)
        options["sharding_strategy"] = strategy
        if hybrid:
            options["device_mesh"] = layout.mesh["dp_replicate", "dp_shard"]
        elif layout.world_size != layout.dp_shard:
            options["process_group"] = layout.submesh("dp_shard").get_group()
        ignored_modules = ignored_submodules(model, self.plugin.ignored_modules)
        ignored = {param for module in ignored_modules for param in module.parameters()}
        if ignored_modules:  # as modules: FSDP1 then neither shards nor wraps them (model._ignored_modules)
            options["ignored_states"] = ignored_modules
        if options["sync_module_states"] and self.processes.device.type == "cpu":
            _sync_from_rank_zero(model, self.plugin.param_init_fn, ignored)
            options.update(sync_module_states=False, param_init_fn=None)
        self._layouts[id(model)] = _meta_copy(model.state_dict(keep_vars=True))
        wrapped = FullyShardedDataParallel(model, **options)
        if self.plugin.activation_checkpointing:
            apply_activation_checkpointing(wrapped, units)
        return wrapped

    def _repoint_optimizers(self, optimizers, originals: dict, prepared: list) -> None:
        """With ``use_orig_params`` the wrapper keeps the parameters' names: re-point by name. Without it the
        parameters are flattened: an optimizer with one parameter group trains the flat parameters instead."""
        if self.plugin.use_orig_params:
            super()._repoint_optimizers(optimizers, originals, prepared)
            return
        flat = [p for model in prepared for p in model.parameters()]
        optimizers = [o for o in optimizers if any(id(p) in originals for g in o.param_groups for p in g["params"])]
        for optimizer in optimizers:  # (an optimizer built on a prepared model's flat parameters stays as it is)
            if optimizer.state:
                super()._repoint_optimizers([optimizer], originals, prepared)  # raises the "already stepped" error
            if len(optimizer.param_groups) != 1:
                raise ValueError(
                    f"The optimizer has {len(optimizer.param_groups)} parameter groups and FSDP1 flattens the "
                    "parameters (use_orig_params=False): set use_orig_params=True (FSDP_USE_ORIG_PARAMS=true) to keep "
                    "per-parameter groups, or use fsdp_version=2.")
            optimizer.param_groups[0]["params"] = flat

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        with model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext():
            yield

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2, *,
                        models: Sequence[nn.Module] = (),
                        optimizers: Sequence[torch.optim.Optimizer] = ()) -> torch.Tensor:
        """FSDP1's own clipping (the norm of every rank's shards) when one model is prepared."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrapped = [m for m in models if isinstance(m, FullyShardedDataParallel)]
        if len(wrapped) == 1:
            return wrapped[0].clip_grad_norm_(max_norm, norm_type)
        return super().clip_grad_norm_(parameters, max_norm, norm_type, models=models, optimizers=optimizers)

    def unwrap(self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        while isinstance(model, FullyShardedDataParallel):
            model = model.module
        return super().unwrap(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile)

    def _state_dict_module(self, model: nn.Module) -> nn.Module:
        return getattr(model, "_orig_mod", model)  # torch's state-dict API needs the FSDP1 wrapper itself

    # torch's get_model_state_dict / get_optimizer_state_dict gather FSDP1 full states with offload_to_cpu, which
    # breaks when the parameters already live on the CPU (the unsharded views point at freed storage). On the
    # CPU the full states are gathered to the main process without offloading, through FSDP1's own API.
    def _cpu(self) -> bool:
        return self.processes.device.type == "cpu"

    def _full_context(self, model):
        from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP.state_dict_type(self._state_dict_module(model), StateDictType.FULL_STATE_DICT,
                                    FullStateDictConfig(offload_to_cpu=False, rank0_only=True),
                                    FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True))

    def model_state_dict(self, model: nn.Module, full: bool = True) -> dict:
        if not (full and self._cpu()):
            return super().model_state_dict(model, full)
        with self._full_context(model):
            state = self._state_dict_module(model).state_dict()
        return {key: value.detach().clone() for key, value in state.items()} if self.processes.is_main_process else {}

    def optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> dict:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from ...checkpointing.optimizer_names import by_position
        from .fsdp2 import _required

        if not self._cpu():
            return super().optimizer_state_dict(model, optimizer)
        inner = getattr(optimizer, "optimizer", optimizer)
        module = self._state_dict_module(_required(model, optimizer))
        with self._full_context(model):
            named = FSDP.optim_state_dict(module, inner)
        if not self.processes.is_main_process:
            return {}
        return by_position(named, self.optimizer_parameter_names(model, inner), inner.param_groups)


def _meta_copy(state: dict) -> dict:
    """``state`` with every tensor replaced by one of the same shape and dtype on meta (no memory); names of one
    tensor (tied weights) share one copy."""
    import torch

    copies: dict = {}
    result = {}
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            result[name] = copies.setdefault(id(value), torch.empty_like(value, device="meta"))
        else:
            result[name] = value
    return result


def _sync_from_rank_zero(model: nn.Module, param_init_fn, ignored) -> None:
    """What FSDP1's ``sync_module_states`` does on GPUs, for CPU processes: materialise modules built on the meta
    device (``param_init_fn``, as FSDP1 would), then give every rank rank 0's parameters and buffers."""
    import torch.distributed as dist
    from torch.distributed.utils import _sync_module_states

    if param_init_fn is not None:
        for module in list(model.modules()):
            if any(t.device.type == "meta" for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]):
                param_init_fn(module)
    skip = {name for name, parameter in model.named_parameters() if parameter in set(ignored or ())}
    _sync_module_states(model, dist.group.WORLD, broadcast_bucket_size=250 * 1024 * 1024, src=0,
                        params_and_buffers_to_ignore=skip)
