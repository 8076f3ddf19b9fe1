"""Accelerate's FSDP model and optimizer file functions (``save_fsdp_model`` ...), on hasten's FSDP strategy.

They write and read the reference library's names (``ShardedFormat``, checkpointing/sharded_files.py), per the
plugin's ``state_dict_type``: ``FULL_STATE_DICT`` the gathered model file on the main process and ``optimizer[_i].bin``
keyed by name; ``SHARDED_STATE_DICT`` the DCP folders of the model and the optimizer, per rank.

``Accelerator.save_state`` / ``load_state`` do all of this atomically, with the rest of the training state; these
functions are for scripts and libraries written against Accelerate's lower-level API (transformers' Trainer saves
and resumes FSDP runs through them). Loading checks names and shapes and reads nothing beyond tensors and plain
values.

``adapter_only=True`` (transformers passes it for every model) saves and loads only a PEFT model's trainable
adapter weights, keyed as in the whole model's state dict; for any other model it changes nothing.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol, Union

import torch

from ...checkpointing.full_files import FullStateFormat
from ...checkpointing.sharded_files import ShardedFormat
from ...core.planned import not_yet_supported
from ...parallel import ParallelDims

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ...config.fsdp import FullyShardedDataParallelPlugin
    from ..base import Strategy

__all__ = ["save_fsdp_model", "load_fsdp_model", "save_fsdp_optimizer", "load_fsdp_optimizer",
           "fsdp2_load_full_state_dict", "fsdp2_switch_optimizer_parameters", "fsdp2_apply_ac",
           "fsdp2_prepare_model"]


class _RunningAccelerator(Protocol):
    """What these functions ask of the ``Accelerator`` (a room above this one: named by what it does, not imported)."""

    @property
    def strategy(self) -> Strategy: ...

    @property
    def is_main_process(self) -> bool: ...

    def wait_for_everyone(self) -> None: ...


class _PluginState(Protocol):
    """The ``state`` of an ``Accelerator``: the run's FSDP plugin."""

    @property
    def fsdp_plugin(self) -> Optional[FullyShardedDataParallelPlugin]: ...


class _AccelerateLike(Protocol):
    """What ``fsdp2_prepare_model`` reads of an ``Accelerator`` (hasten's, or any object that looks like Accelerate's):
    its state's plugin and the run's mesh, precision and device."""

    @property
    def state(self) -> _PluginState: ...

    @property
    def torch_device_mesh(self) -> Optional[DeviceMesh]: ...

    @property
    def mixed_precision(self) -> str: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def is_main_process(self) -> bool: ...


def _strategy(accelerator, what: str):
    from .fsdp2 import FSDP2Strategy

    strategy = accelerator.strategy
    if not isinstance(strategy, FSDP2Strategy):
        raise ValueError(f"{what} works on models prepared with FSDP (Accelerator(fsdp_plugin=...)); this run uses "
                         f"{type(strategy).__name__}. Use accelerator.save_state / load_state instead.")
    return strategy


def _adapter_names(strategy, model, adapter_only: bool) -> Optional[set]:
    """The names of a PEFT model's trainable (adapter) parameters when only they are saved or loaded; None when the
    whole model is (``adapter_only`` is False, or the model is not a PEFT model)."""
    from ...core.modules import is_peft_model

    module = strategy.unwrap(model)
    if not (adapter_only and is_peft_model(module)):
        return None
    return {name for name, parameter in module.named_parameters() if parameter.requires_grad}


def _only(state: dict, names: Optional[set]) -> dict:
    return state if names is None else {key: value for key, value in state.items() if key in names}


def _kind(fsdp_plugin, use_dcp: bool) -> str:
    from torch.distributed.fsdp import StateDictType

    if fsdp_plugin.state_dict_type == StateDictType.FULL_STATE_DICT:
        return "full"
    if fsdp_plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT and use_dcp:
        return "sharded"
    raise not_yet_supported(f"per-rank torch.save FSDP checkpoints ({fsdp_plugin.state_dict_type.name}, "
                            f"use_dcp={use_dcp})", "use SHARDED_STATE_DICT with use_dcp=True, or FULL_STATE_DICT")


def _load_shards(state: dict, folder: Path) -> None:
    from ...checkpointing.sharded_io import check_against_metadata, load_shards

    key = next(iter(state))
    check_against_metadata(folder, state[key], key, True)
    load_shards(state, folder, allow_partial=False)


def save_fsdp_model(fsdp_plugin: FullyShardedDataParallelPlugin, accelerator: _RunningAccelerator,
                    model: torch.nn.Module, output_dir: Union[str, os.PathLike], model_index: int = 0,
                    adapter_only: bool = False, use_dcp: bool = True) -> None:
    """Save ``model``'s weights to ``output_dir`` (collective: call it on every process)."""
    import torch.distributed.checkpoint as dcp

    strategy = _strategy(accelerator, "save_fsdp_model")
    kind = _kind(fsdp_plugin, use_dcp)
    names = _adapter_names(strategy, model, adapter_only)
    os.makedirs(output_dir, exist_ok=True)
    if kind == "full":
        state = _only(strategy.model_state_dict(model, full=True), names)
        if accelerator.is_main_process:
            torch.save(state, Path(output_dir) / ShardedFormat.gathered_model_file(model_index))
    else:
        dcp.save({"model": _only(strategy.sharded_model_state_dict(model), names)},
                 checkpoint_id=str(Path(output_dir) / ShardedFormat.model_folder(model_index)))
    accelerator.wait_for_everyone()


def load_fsdp_model(fsdp_plugin: FullyShardedDataParallelPlugin, accelerator: _RunningAccelerator,
                    model: torch.nn.Module, input_dir: Union[str, os.PathLike], model_index: int = 0,
                    adapter_only: bool = False, use_dcp: bool = True) -> None:
    """Load weights ``save_fsdp_model`` saved (collective)."""
    from ...checkpointing.sharded_io import empty_like

    strategy = _strategy(accelerator, "load_fsdp_model")
    kind = _kind(fsdp_plugin, use_dcp)
    names = _adapter_names(strategy, model, adapter_only)
    if kind == "full":
        path = Path(input_dir) / ShardedFormat.gathered_model_file(model_index)
        state = _only(torch.load(path, map_location="cpu", weights_only=True), names)
    else:
        folder = Path(input_dir) / ShardedFormat.model_folder(model_index)
        folder = folder if folder.is_dir() else Path(input_dir)  # the model's DCP folder itself
        state = {"model": empty_like(_only(strategy.sharded_model_state_dict(model), names))}
        _load_shards(state, folder)
        state = state["model"]
    strategy.load_model_state_dict(model, state, strict=names is None)  # an adapter is part of the model
    accelerator.wait_for_everyone()


def save_fsdp_optimizer(fsdp_plugin: FullyShardedDataParallelPlugin, accelerator: _RunningAccelerator,
                        optimizer: torch.optim.Optimizer, model: torch.nn.Module, output_dir: Union[str, os.PathLike],
                        optimizer_index: int = 0, use_dcp: bool = True) -> None:
    """Save ``optimizer``'s state (which trains ``model``) to ``output_dir`` (collective)."""
    import torch.distributed.checkpoint as dcp

    from ...checkpointing.optimizer_names import by_name

    strategy = _strategy(accelerator, "save_fsdp_optimizer")
    kind = _kind(fsdp_plugin, use_dcp)
    os.makedirs(output_dir, exist_ok=True)
    if kind == "full":
        state = strategy.optimizer_state_dict(model, optimizer)
        if accelerator.is_main_process:  # keyed by name, as the reference library writes it
            torch.save(by_name(state, strategy.optimizer_parameter_names(model, optimizer)),
                       Path(output_dir) / FullStateFormat.optimizer_file(optimizer_index))
    else:
        dcp.save({"optimizer": strategy.sharded_optimizer_state_dict(model, optimizer)},
                 checkpoint_id=str(Path(output_dir) / ShardedFormat.optimizer_folder(optimizer_index)))
    accelerator.wait_for_everyone()


def load_fsdp_optimizer(fsdp_plugin: FullyShardedDataParallelPlugin, accelerator: _RunningAccelerator,
                        optimizer: torch.optim.Optimizer, model: torch.nn.Module, input_dir: Union[str, os.PathLike],
                        optimizer_index: int = 0, adapter_only: bool = False, use_dcp: bool = True) -> None:
    """Load an optimizer state ``save_fsdp_optimizer`` saved (collective)."""
    from ...checkpointing.optimizer_names import by_position
    from ...checkpointing.sharded_io import empty_like

    strategy = _strategy(accelerator, "load_fsdp_optimizer")
    kind = _kind(fsdp_plugin, use_dcp)  # adapter_only: the optimizer trains the adapter's parameters only anyway
    if kind == "full":
        named = torch.load(Path(input_dir) / FullStateFormat.optimizer_file(optimizer_index), map_location="cpu",
                           weights_only=True)
        state = by_position(named, strategy.optimizer_parameter_names(model, optimizer), named["param_groups"])
    else:
        folder = Path(input_dir) / ShardedFormat.optimizer_folder(optimizer_index)
        folder = folder if folder.is_dir() else Path(input_dir)
        state = {"optimizer": empty_like(strategy.sharded_optimizer_state_dict(model, optimizer))}
        _load_shards(state, folder)
        state = state["optimizer"]
    strategy.load_optimizer_state_dict(model, optimizer, state)
    accelerator.wait_for_everyone()


def fsdp2_load_full_state_dict(accelerator: _RunningAccelerator, model: torch.nn.Module, full_sd: dict,
                               cpu_offload: bool = False) -> torch.nn.Module:
    """Give an FSDP2-sharded ``model`` the full state dict ``full_sd`` of the main process (the others may pass
    an empty dict): each rank receives its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # a copy of the mapping: torch replaces its values with the distributed tensors it builds
    set_model_state_dict(model, dict(full_sd) if accelerator.is_main_process else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                  cpu_offload=cpu_offload))
    return model


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict[int, torch.Tensor]) -> None:
    """Point ``optimizer`` at new parameters: ``mapping`` maps an old parameter's ``data_ptr()`` to its new one."""
    for group in optimizer.param_groups:
        try:
            group["params"] = [mapping[param.data_ptr()] for param in group["params"]]
        except KeyError:
            raise KeyError("A parameter of the optimizer has no new parameter in `mapping` (keyed by the old "
                           "parameters' data_ptr()): build the mapping from the model the optimizer was created "
                           "on, before sharding it.") from None


def fsdp2_apply_ac(accelerator: _RunningAccelerator, model: torch.nn.Module) -> torch.nn.Module:
    """Activation checkpointing on the plugin's wrap units (or the model's children), in place; returns ``model``."""
    from .wrapping import apply_activation_checkpointing, wrap_policy, wrap_units

    plugin = _strategy(accelerator, "fsdp2_apply_ac").plugin
    apply_activation_checkpointing(model, wrap_units(model, wrap_policy(model, plugin)),
                                   offload=bool(plugin.activation_checkpointing_offload))
    return model


def fsdp2_prepare_model(accelerator: _AccelerateLike, model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` in place as ``prepare()`` does (units, then the root); returns it.

    ``accelerator`` is a hasten Accelerator running FSDP2, or any object that looks like one: then its
    ``state.fsdp_plugin`` decides the units (as ``prepare()`` makes them), resharding, precision, offload
    and ignored modules; ``torch_device_mesh`` (None: every process), ``mixed_precision``, ``device`` and
    ``is_main_process`` are read from it. Activation checkpointing is then ``fsdp2_apply_ac``'s job."""
    from .fsdp2 import FSDP2Strategy, shard_in_units

    strategy = getattr(accelerator, "strategy", None)
    if isinstance(strategy, FSDP2Strategy) or getattr(getattr(accelerator, "state", None), "fsdp_plugin", None) is None:
        return _strategy(accelerator, "fsdp2_prepare_model").shard_model(model)

    return shard_in_units(model, accelerator.state.fsdp_plugin,
                          mesh=ParallelDims.fsdp_mesh_of(accelerator.torch_device_mesh),
                          mixed_precision=accelerator.mixed_precision, device=accelerator.device,
                          is_main_process=accelerator.is_main_process)
