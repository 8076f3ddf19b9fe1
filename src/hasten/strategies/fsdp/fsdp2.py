"""Fully Sharded Data Parallel with FSDP2 (``torch.distributed.fsdp.fully_shard``), on CPU (gloo) and GPU (nccl).

Parameters, gradients and optimizer state are sharded over the layout's ``dp_shard`` dimension; with
``dp_replicate > 1`` too (a ``ParallelismConfig``), shards are replicated across replica groups (HSDP). The
preparation order: the precision's forward wrapper, activation checkpointing of the wrap units, ``fully_shard``
on each unit (children first) then on the root, then compilation; the optimizers given in the same
``prepare()`` call are re-pointed at the sharded parameters.

Checkpoints hold full state dicts (gathered to the main process with CPU offload), in the same files as every
other strategy, so they load across strategies and numbers of processes.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Iterable, Iterator, Optional, Sequence, TYPE_CHECKING

import torch
from torch import nn

from ...checkpointing.optimizer_names import by_name, by_position, clean_name, is_shard, parameter_names
from ...config.enums import DistributedType
from ..base import Strategy
from .sharding import shard_with_plugin
from .save_pretrained import gather_in_save_pretrained
from .wrapping import apply_activation_checkpointing, wrap_policy, wrap_units

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ...config.accelerator_settings import AcceleratorSettings
    from ...config.fsdp import FullyShardedDataParallelPlugin
    from ...parallel import ParallelDims
    from ...state import PartialState

__all__ = ["FSDP2Strategy", "gather_in_run_precision", "shard_in_units"]


class FSDP2Strategy(Strategy):
    """Shards every prepared model with ``fully_shard`` over the data-parallel shard mesh."""

    distributed_type = DistributedType.FSDP
    prepares_models_with_optimizers = True
    saves_from_one_process = False  # every rank holds shards
    fsdp_version = 2

    def __init__(self, processes: PartialState, settings: Optional[AcceleratorSettings] = None,
                 dims: Optional[ParallelDims] = None, plugin: Optional[FullyShardedDataParallelPlugin] = None):
        from ...config.fsdp import FullyShardedDataParallelPlugin

        self.plugin = plugin if plugin is not None else FullyShardedDataParallelPlugin(fsdp_version=2)
        if not isinstance(self.plugin, FullyShardedDataParallelPlugin):
            raise TypeError(f"fsdp_plugin must be a FullyShardedDataParallelPlugin, got {type(self.plugin).__name__}.")
        if self.plugin.fsdp_version != self.fsdp_version:
            raise ValueError(f"{type(self).__name__} runs fsdp_version={self.fsdp_version}, and the plugin asks for "
                             f"{self.plugin.fsdp_version}: select the strategy with strategies.select_strategy.")
        super().__init__(processes, settings, _sharded_layout(dims, processes.num_processes))
        gather_in_run_precision(self.plugin, self.settings.mixed_precision)
        self.checkpoint_io = _checkpoint_io(self.plugin)
        self._optimizer_names: dict = {}  # id(optimizer) -> its parameters' names per group, as prepared

    # ------------------------------------------------------------ precision and set-up
    def grad_scaler_class(self) -> type:
        """Autocast as on other backends (``mixed_precision_policy`` casts the sharded parameters besides); fp16
        gradients are unscaled by a scaler that checks every rank's shard for overflow."""
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler

    def state_views(self) -> dict:
        return {**super().state_views(), "distributed_type": DistributedType.FSDP,  # what scripts check
                "fsdp_plugin": self.plugin}

    def context_parallel(self, buffers: Optional[Sequence[torch.Tensor]] = None,
                         buffer_seq_dims: Optional[Sequence[int]] = None,
                         no_restore_buffers: Optional[set] = None) -> Optional[ContextManager]:
        """The block of one context-parallel step over the layout's ``cp`` dimension
        (``strategies/model_parallel/context_parallel.py``), or None when this run splits no sequence (``cp_size``
        1)."""
        layout = self.layout
        if layout is None or layout.cp == 1:
            return None
        from ..model_parallel.context_parallel import context_parallel_block

        handler = getattr(getattr(layout, "_config", None), "cp_handler", None)
        return context_parallel_block(layout.submesh("cp"), buffers, buffer_seq_dims, no_restore_buffers,
                                      comm_strategy=getattr(handler, "cp_comm_strategy", None) or "allgather")

    def setup(self) -> None:
        if self.processes.num_processes == 1:  # debugging FSDP on one device: torch shards over a world of one
            getattr(self.processes, "_partial", self.processes).start_single_process_group()
        if self.processes.device.type == "cpu":  # freed shard buffers go back to the system (core/allocator.py)
            from ...core.allocator import limit_heap_retention

            limit_heap_retention()

    # ------------------------------------------------------------ preparation
    def prepare_training(self, models: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
                         device_placement: Sequence[bool], evaluation_mode: bool = False,
                         compile_model: Optional[Callable[[nn.Module], nn.Module]] = None,
                         **context: Any) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        originals = {}  # id(original parameter) -> its name, to re-point the optimizers afterwards
        prepared = []
        for model, place in zip(models, device_placement):
            on_meta = any(p.device.type == "meta" for p in model.parameters())
            if on_meta and not (self.plugin.cpu_ram_efficient_loading and not self.processes.is_main_process):
                raise ValueError(
                    "The model given to prepare() has parameters on the meta device (no weights). With FSDP only the "
                    "non-main processes may build it so, with cpu_ram_efficient_loading=True (FSDP_CPU_RAM_EFFICIENT_"
                    "LOADING=true): the main process's weights are then sent to them.")
            if place and not on_meta:
                model = model.to(self.processes.device)
            originals.update({id(p): clean_name(n) for n, p in model.named_parameters()})
            model = self.shard_model(self.precision.wrap_forward(model))
            gather_in_save_pretrained(model)  # its save_pretrained() writes the full weights (save_pretrained.py)
            prepared.append(compile_model(model) if compile_model is not None else model)
        for optimizer in optimizers:  # names in the optimizer's own order: its state's positions in a checkpoint
            if _holds_originals(optimizer, originals):
                self._optimizer_names[id(optimizer)] = [[originals.get(id(p), "") for p in group["params"]]
                                                        for group in optimizer.param_groups]
            # else: built on parameters sharded already (prepared after its model): named from the model itself
        self._repoint_optimizers(optimizers, originals, prepared)
        return prepared, [self.prepare_optimizer(o) for o in optimizers]

    def _repoint_optimizers(self, optimizers, originals: dict, prepared: list) -> None:
        """Point the optimizers at the sharded parameters that replaced the originals (matched by name)."""
        sharded = {clean_name(n): p for model in prepared for n, p in self.unwrap(model).named_parameters()}
        tied = any(getattr(getattr(self.unwrap(model), "config", None), "tie_word_embeddings", False) is True
                   for model in prepared)
        for optimizer in optimizers:
            if _holds_originals(optimizer, originals):
                _repoint(optimizer, originals, sharded, tied)
            # else: built on the parameters of a model prepared before (the Accelerator checked), nothing to re-point

    def shard_model(self, model: nn.Module) -> nn.Module:
        """Shard ``model`` in place (activation checkpointing of the wrap units, ``fully_shard`` on each unit, then
        the root; sharding.py) and return it."""
        return shard_in_units(model, self.plugin, mesh=self.layout.fsdp_mesh(self.processes.device.type),
                              mixed_precision=self.settings.mixed_precision, device=self.processes.device,
                              is_main_process=self.processes.is_main_process, checkpoint_units=True,
                              broadcast_weights=_broadcast_weights)

    # ------------------------------------------------------------ the training step
    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        sharded = self.unwrap(model)
        if not hasattr(sharded, "set_requires_gradient_sync"):
            yield
            return
        sharded.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            sharded.set_requires_gradient_sync(True)

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2, *,
                        models: Sequence[nn.Module] = (),
                        optimizers: Sequence[torch.optim.Optimizer] = ()) -> torch.Tensor:
        """The total norm of the gradients (sharded ones reduced over their mesh; those of ignored modules are
        local), the same on every rank; then every gradient is scaled by one factor."""
        groups, total = self.total_grad_norm(parameters, norm_type)
        if total is None:
            return torch.tensor(0.0)
        for members in groups.values():
            torch.nn.utils.clip_grads_with_norm_(members, max_norm, total)
        return total

    def total_grad_norm(self, parameters: Iterable[torch.Tensor], norm_type: float = 2,
                        ) -> tuple[dict[Optional[DeviceMesh], list[torch.Tensor]], Optional[torch.Tensor]]:
        """``(parameters by the mesh of their gradient, the total norm)``; the norm is None without gradients."""
        from torch.distributed.tensor import DTensor

        groups: dict = {}  # sharded gradients by mesh, local ones under None
        for param in parameters:
            if param.grad is not None:
                key = param.grad.device_mesh if isinstance(param.grad, DTensor) else None
                groups.setdefault(key, []).append(param)
        norms = []
        for members in groups.values():
            norm = torch.nn.utils.get_total_norm([p.grad for p in members], norm_type=norm_type)
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if not norms:
            return groups, None
        return groups, torch.nn.utils.get_total_norm(norms, norm_type=norm_type)

    # ------------------------------------------------------------ state dicts (full, on the main process)
    def _options(self, **extra):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **extra)

    def _state_dict_module(self, model: nn.Module) -> nn.Module:
        """The module torch's state-dict API is given (FSDP2: the user's module, sharded in place)."""
        return self.unwrap(model)

    def optimizer_parameter_names(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
        """The names of ``optimizer``'s parameters per group, in the order it was given them (before sharding)."""
        inner = getattr(optimizer, "optimizer", optimizer)
        return self._optimizer_names.get(id(inner)) or parameter_names(self.unwrap(model), inner)


    def optimizer_group_sizes(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> list[int]:
        return [len(group) for group in self.optimizer_parameter_names(_required(model, optimizer), optimizer)]

    def model_state_dict(self, model: nn.Module, full: bool = True) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        if not full:
            return self.unwrap(model).state_dict()
        return get_model_state_dict(self._state_dict_module(model), options=self._options(cpu_offload=True))

    def sharded_model_state_dict(self, model: nn.Module) -> dict:
        """This rank's shards of the model's state, keyed by parameter name."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self._state_dict_module(model), options=StateDictOptions(full_state_dict=False))

    def sharded_optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> dict:
        """This rank's shards of the optimizer's state, keyed by parameter name."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(self._state_dict_module(_required(model, optimizer)),
                                        getattr(optimizer, "optimizer", optimizer),
                                        options=StateDictOptions(full_state_dict=False))

    def sharded_state_dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
        """``(model's, optimizer's)``: this rank's shards of both states, keyed by parameter name, for an optimizer
        that trains ``model``, from one call of torch's state-dict API (it maps the parameters' names once for both:
        an asynchronous save's snapshot is that much shorter)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        return get_state_dict(self._state_dict_module(model), getattr(optimizer, "optimizer", optimizer),
                              options=StateDictOptions(full_state_dict=False))

    def load_model_state_dict(self, model: nn.Module, state_dict: dict, strict: bool = True) -> Optional[tuple]:
        """A full state dict (plain tensors) or this rank's shards (from a sharded checkpoint)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        sharded = any(is_shard(value) for value in state_dict.values())
        return set_model_state_dict(self._state_dict_module(model), state_dict,
                                    options=StateDictOptions(full_state_dict=not sharded, strict=strict))

    def optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        inner = getattr(optimizer, "optimizer", optimizer)
        module = self._state_dict_module(_required(model, optimizer))
        named = get_optimizer_state_dict(module, inner, options=self._options(cpu_offload=True))
        return by_position(named, self.optimizer_parameter_names(model, inner), inner.param_groups)

    def load_optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer,
                                  state_dict: dict) -> None:
        """A full state laid out by position (full files), or this rank's part keyed by name (sharded files: shards,
        or whole tensors where FSDP1 on one process does not shard)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        inner = getattr(optimizer, "optimizer", optimizer)
        module = self._state_dict_module(_required(model, optimizer))
        entries = state_dict.get("state", {})
        if entries and all(isinstance(key, str) for key in entries):  # keyed by name: this rank's part
            set_optimizer_state_dict(module, inner, state_dict, options=StateDictOptions(full_state_dict=False))
            return
        if _holds_tensors(entries):  # else a stateless optimizer (SGD without momentum):
            named = by_name(state_dict, self.optimizer_parameter_names(model, inner))  # torch's loader needs tensors
            set_optimizer_state_dict(module, inner, named, options=self._options())
        for live, saved in zip(inner.param_groups, state_dict["param_groups"]):  # hyperparameters as saved
            live.update({key: value for key, value in saved.items() if key != "params"})  # (tuples stay tuples)


def _holds_tensors(state) -> bool:
    """Whether an optimizer's ``state`` holds a tensor with elements (a stateless optimizer's holds none)."""
    from torch.utils._pytree import tree_leaves

    return any(isinstance(leaf, torch.Tensor) and leaf.dim() > 0 for leaf in tree_leaves(state))


def _holds_originals(optimizer, originals: dict) -> bool:
    """Whether ``optimizer`` was built on the parameters being sharded now (not on a model prepared before)."""
    return any(id(p) in originals for group in optimizer.param_groups for p in group["params"])


def _checkpoint_io(plugin):
    """Shards written per rank with DCP for ``SHARDED_STATE_DICT`` (FSDP2's default), full files otherwise."""
    from torch.distributed.fsdp import StateDictType

    from ...checkpointing.checkpoint_io import FullStateCheckpointIO
    from ...checkpointing.sharded_io import ShardedCheckpointIO

    return ShardedCheckpointIO() if plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT \
        else FullStateCheckpointIO()


def _sharded_layout(dims, world_size: int):
    """The layout FSDP shards over: the ParallelismConfig's, or every process one shard."""
    from ...parallel import ParallelDims

    if dims is None or (dims.dp_shard == 1 and not dims.model_parallel):
        return ParallelDims(dp_shard=world_size, world_size=world_size)
    return dims


def gather_in_run_precision(plugin: FullyShardedDataParallelPlugin, mixed_precision: Optional[str]) -> None:
    """As in the reference: a plugin without a mixed-precision policy gathers the parameters and reduces the
    gradients in the run's ``"fp16"`` / ``"bf16"`` (the plugin is changed in place). The planner applies it too."""
    if plugin.mixed_precision_policy is None and mixed_precision in ("fp16", "bf16"):
        plugin.set_mixed_precision(mixed_precision)


def shard_in_units(model: nn.Module, plugin: FullyShardedDataParallelPlugin, *, mesh: Optional[DeviceMesh],
                   mixed_precision: Optional[str], device: torch.device, is_main_process: bool,
                   checkpoint_units: bool = False,
                   broadcast_weights: Optional[Callable[[nn.Module, dict, torch.device], None]] = None) -> nn.Module:
    """Shard ``model`` in place as ``prepare()`` does and return it: the plugin's wrap units (activation checkpointing
    of each first, with ``checkpoint_units`` and the plugin's ``activation_checkpointing``), ``fully_shard`` on
    each over ``mesh``, then the root (``shard_with_plugin``). A model already sharded is returned as it is.
    ``FSDP2Strategy.shard_model`` and Accelerate's ``fsdp2_prepare_model`` both shard through here."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return model
    units = wrap_units(model, wrap_policy(model, plugin))
    if checkpoint_units and plugin.activation_checkpointing:
        apply_activation_checkpointing(model, units, offload=plugin.activation_checkpointing_offload)
        units = [_checkpointed(model, unit) for unit in units]
    return shard_with_plugin(model, plugin, units, mesh=mesh, mixed_precision=mixed_precision, device=device,
                             is_main_process=is_main_process, broadcast_weights=broadcast_weights)


def _broadcast_weights(model: nn.Module, full: dict, device: torch.device) -> None:
    """``cpu_ram_efficient_loading``: give every rank its shards of the main process's ``full`` state dict (the
    others allocate only their shards, from meta), and the main process's non-persistent buffers."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(p.device.type == "meta" for p in model.parameters()) or \
            any(b.device.type == "meta" for b in model.buffers()):
        model.to_empty(device=device)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    persistent = set(model.state_dict().keys())
    for name, buffer in model.named_buffers():
        if clean_name(name) not in persistent:
            dist.broadcast(buffer, src=0)


def _checkpointed(model: nn.Module, unit: nn.Module) -> nn.Module:
    """The activation-checkpointing wrapper that now holds ``unit`` (FSDP shards the wrapper)."""
    for module in model.modules():
        if getattr(module, "_checkpoint_wrapped_module", None) is unit:
            return module
    return unit


def _repoint(optimizer, originals: dict, sharded: dict, tied_embeddings: bool = False) -> None:
    """Point ``optimizer``'s parameter groups at the sharded parameters that replaced the originals (by name; a
    name the sharded model lacks raises before any group changes, with a hint when the model ties its
    embeddings)."""
    if optimizer.state:
        raise ValueError(
            "The optimizer has already stepped (it holds state for the unsharded parameters): prepare the model and "
            "its optimizer before the first optimizer step.")
    names = [[originals.get(id(param)) for param in group["params"]] for group in optimizer.param_groups]
    if any(name is None for group in names for name in group):
        raise ValueError(
            "An optimizer given to prepare() trains a parameter of no model in the same prepare() call: with "
            "FSDP, pass each model and its optimizer together: model, optimizer = accelerator.prepare("
            "model, optimizer).")
    lost = sorted({name for group in names for name in group if name not in sharded})
    if lost:  # checked for every group before any group changes
        raise ParametersLostInSharding(lost, tied_embeddings)
    for group, group_names in zip(optimizer.param_groups, names):
        group["params"] = [sharded[name] for name in group_names]


class ParametersLostInSharding(KeyError, ValueError):
    """Parameters the optimizer trains that the sharded model no longer has under their names (a KeyError, as the
    reference raises, and a ValueError, as it raises when the weights are tied)."""

    def __init__(self, lost: list, tied_embeddings: bool = False):
        hint = (" The model ties its embeddings: FSDP2 mapping failed for tied embeddings; tie them again after "
                "prepare, or set tie_word_embeddings = False in the model's config.") if tied_embeddings else ""
        super().__init__(f"Parameters missing after FSDP2 wrapping: {', '.join(lost)}. The optimizer was built on "
                         "them, but the sharded model has no parameter of that name, so it cannot be re-pointed." + hint)

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def _required(model, optimizer):
    if model is None:
        raise ValueError(f"No prepared model owns the parameters of this {type(optimizer).__name__}: FSDP needs the "
                         "model to gather its optimizer's state.")
    return model
