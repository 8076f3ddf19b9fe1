"""Choosing the run's strategy: ``select_strategy`` reads the plugins given, the launcher's environment and the
layout, and builds one backend.

A backend is chosen by a plugin argument (``Accelerator(fsdp_plugin=...)``), by the launcher's environment
(``distributed_type: FSDP`` in a config file makes ``hasten launch`` export ``HASTEN_USE_FSDP=true``), or by a
``ParallelismConfig`` whose sizes need it. A backend without a factory raises ``NotYetSupportedError`` whichever
way it was asked for: nothing silently falls back to DDP. A new backend replaces its row in ``_BACKENDS``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, TYPE_CHECKING

from ..config.enums import DistributedType
from ..core.planned import not_yet_supported
from .base import Strategy
from .ddp import DDPStrategy
from .single import SingleDeviceStrategy

if TYPE_CHECKING:
    from ..config.accelerator_settings import AcceleratorSettings
    from ..parallel import ParallelDims
    from ..state import PartialState

__all__ = ["select_strategy", "requested_backend"]


def _fsdp(processes, settings, dims, plugin=None) -> Strategy:
    """FSDP2 (``strategies/fsdp/fsdp2.py``); without a plugin, one read from the launcher's ``FSDP_*`` environment,
    or a default FSDP2 one when a ParallelismConfig's ``dp_shard_size`` asks for sharding."""
    from ..config.fsdp import FullyShardedDataParallelPlugin
    from .fsdp.fsdp1 import FSDP1Strategy
    from .fsdp.fsdp2 import FSDP2Strategy

    if plugin is None:
        plugin = (FullyShardedDataParallelPlugin(fsdp_version=2) if dims is not None and
                  (dims.dp_shard > 1 or dims.cp > 1) and not _launcher_selects(settings, "use_fsdp")
                  else FullyShardedDataParallelPlugin())
    if dims is not None and dims.cp > 1 and isinstance(plugin, FullyShardedDataParallelPlugin) and \
            plugin.fsdp_version == 1:
        raise ValueError("Context parallelism shards parameters over dp_shard x cp with FSDP2: use "
                         "FullyShardedDataParallelPlugin(fsdp_version=2) with ParallelismConfig(cp_size=...).")
    if dims is not None and (dims.tp > 1 or dims.pp > 1):  # FSDP x TP: the model-parallel engine shards with it
        if isinstance(plugin, FullyShardedDataParallelPlugin) and plugin.fsdp_version == 1:
            raise ValueError("Tensor parallelism composes with FSDP2 only: use FullyShardedDataParallelPlugin("
                             "fsdp_version=2) with ParallelismConfig(tp_size=...).")
        return _tensor_parallel(processes, settings, dims, None, fsdp_plugin=plugin)
    if isinstance(plugin, FullyShardedDataParallelPlugin) and plugin.fsdp_version == 1:
        return FSDP1Strategy(processes, settings, dims, plugin)
    return FSDP2Strategy(processes, settings, dims, plugin)


def _tensor_parallel(processes, settings, dims, plugin=None, fsdp_plugin=None) -> Strategy:
    """Tensor parallelism on DTensor (``strategies/model_parallel/strategy.py``), from a ParallelismConfig's
    ``tp_size`` or a ``TorchTensorParallelPlugin`` (whose tp_size splits the processes into tp groups, the rest data
    parallel; its ``torch_device_mesh``, when given, becomes the run's mesh if it has this layout's dimensions and
    sizes, and is refused otherwise: the reference ignores it)."""
    from ..parallel import ParallelDims
    from .model_parallel.strategy import ModelParallelStrategy

    if plugin is not None:
        from ..parallel.config import TorchTensorParallelPlugin

        if not isinstance(plugin, TorchTensorParallelPlugin):
            raise TypeError(f"torch_tp_plugin must be a TorchTensorParallelPlugin, got {type(plugin).__name__}.")
        if dims is not None and dims.tp not in (1, plugin.tp_size):
            raise ValueError(f"torch_tp_plugin has tp_size={plugin.tp_size} and the ParallelismConfig tp_size="
                             f"{dims.tp}: give one of them.")
        mesh = plugin.torch_device_mesh
        if plugin.tp_size == 1 and (dims is None or dims.tp == 1):
            if mesh is not None and mesh.size() > 1 and "tp" in (mesh.mesh_dim_names or ()):
                raise ValueError(f"TorchTensorParallelPlugin(tp_size=1) was given a torch_device_mesh with a 'tp' "
                                 f"dimension of size {mesh['tp'].size()}: set tp_size to it, or leave the mesh out.")
            return _default(processes, settings, dims)  # nothing to split
        if dims is None or dims.tp == 1:
            world = processes.num_processes
            if world % plugin.tp_size:
                raise ValueError(f"TorchTensorParallelPlugin(tp_size={plugin.tp_size}) does not divide the "
                                 f"{world} processes: launch a multiple of {plugin.tp_size}.")
            dims = ParallelDims(dp_replicate=world // plugin.tp_size, tp=plugin.tp_size, world_size=world)
        if mesh is not None:  # the user's mesh is the run's, once it is checked to be this layout's
            dims.adopt_mesh(mesh, given_as="TorchTensorParallelPlugin.torch_device_mesh")
    config = getattr(dims, "_config", None)
    return ModelParallelStrategy(processes, settings, dims, fsdp_plugin,
                                 tp_plan=getattr(getattr(config, "tp_handler", None), "tp_plan", None),
                                 pp_config=getattr(config, "pp_handler", None))


def _deepspeed(processes, settings, dims, plugin=None) -> Strategy:
    """DeepSpeed ZeRO (``strategies/deepspeed/strategy.py``); without a plugin, one read from the launcher's
    ``HASTEN_DEEPSPEED_*`` environment."""
    from .deepspeed.strategy import DeepSpeedStrategy

    return DeepSpeedStrategy(processes, settings, dims, plugin)


def _megatron(processes, settings, dims, plugin=None) -> Strategy:
    """A ``MegatronLMPlugin`` on the torch-native model-parallel engine (``strategies/model_parallel/megatron.py``);
    without a plugin, one read from the launcher's ``HASTEN_MEGATRON_LM_*`` environment."""
    from .model_parallel.megatron import megatron_strategy

    return megatron_strategy(processes, settings, dims, plugin)


def _launcher_selects(settings, switch: str) -> bool:
    """Whether the launcher selected the backend ``switch`` names: the run's resolved settings say (a caller
    without settings, such as a test building a strategy alone, has the environment read for it)."""
    if settings is None:
        from ..config.accelerator_settings import launcher_switches

        return switch in launcher_switches()
    return switch in settings.launcher_switches


@dataclass(frozen=True)
class _Backend:
    label: str
    plugin: str  # the Accelerator argument that selects it
    env_switch: Optional[str]  # the launcher's HASTEN_<SWITCH> (config file distributed_type); None: no switch
    factory: Callable[..., Strategy]  # (processes, settings, dims, plugin) -> Strategy


_BACKENDS = (
    _Backend("FSDP", "fsdp_plugin", "use_fsdp", _fsdp),
    _Backend("DeepSpeed", "deepspeed_plugin", "use_deepspeed", _deepspeed),
    _Backend("Megatron-LM", "megatron_lm_plugin", "use_megatron_lm", _megatron),
    _Backend("tensor parallelism", "torch_tp_plugin", None, _tensor_parallel),
)

def requested_backend(plugins: dict[str, Any],
                      settings: Optional[AcceleratorSettings] = None) -> Optional[tuple[_Backend, str]]:
    """``(backend, how it was asked for)`` for the first backend a plugin argument or the launcher (``settings``'
    ``launcher_switches``) selects, else None."""
    from ..core.env_aliases import setting_variables

    given = [backend for backend in _BACKENDS if plugins.get(backend.plugin) is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(b.plugin + '=...' for b in given)} select different backends ("
                         f"{', '.join(b.label for b in given)}): give one. FSDP with tensor parallelism is "
                         "fsdp_plugin with ParallelismConfig(tp_size=..., dp_shard_size=...).")
    for backend in given:
        return backend, f"{backend.plugin}=..."
    for backend in _BACKENDS:
        if backend.env_switch is not None and _launcher_selects(settings, backend.env_switch):
            variable = setting_variables(backend.env_switch)[0]
            return backend, (f"{variable}=true, set by `hasten launch` from a config file's distributed_type or a "
                             "--use_* flag")
    return None


def _needed_by_layout(dims) -> Optional[tuple]:
    """The backend a ParallelismConfig's sizes need beyond data-parallel replication, and which sizes."""
    if dims is None:
        return None
    wants = []
    if getattr(dims, "pp", 1) > 1:
        wants.append(("tensor parallelism", f"pp_size={dims.pp}"))  # the same torch-native engine
    if dims.tp > 1:
        wants.append(("tensor parallelism", f"tp_size={dims.tp}"))
    if dims.cp > 1:  # FSDP2 over dp_shard x cp (strategies/fsdp/fsdp2.py), the sequence split in maybe_context_parallel
        wants.append(("FSDP (sharded data parallelism)", f"cp_size={dims.cp}"))
    if getattr(dims, "sp", 1) > 1:  # refused without DeepSpeed before this is asked (select_strategy)
        wants.append(("DeepSpeed sequence parallelism", f"sp_size={dims.sp}"))
    if dims.dp_shard > 1:  # last: sharding alone is FSDP, which exists
        wants.append(("FSDP (sharded data parallelism)", f"dp_shard_size={dims.dp_shard}"))
    return wants[0] if wants else None


def select_strategy(processes: PartialState, settings: Optional[AcceleratorSettings] = None,
                    dims: Optional[ParallelDims] = None, **plugins: Any) -> Strategy:
    """The strategy for this run, from the plugins given, the launcher's environment and the layout ``dims``
    (a ``ParallelDims``), else from the process state (one device, or DDP). ``settings``: the run's
    ``AcceleratorSettings`` (precision, kwargs handlers), handed to the strategy."""
    asked = requested_backend(plugins, settings)
    if getattr(dims, "sp", 1) > 1 and (asked is None or asked[0].factory is not _deepspeed):
        raise _sequence_parallelism_needs_deepspeed(dims, asked)
    if asked is not None:
        backend, _ = asked
        return backend.factory(processes, settings, dims, plugins.get(backend.plugin))
    needed = _needed_by_layout(dims)
    if needed is not None and needed[0].startswith("FSDP"):
        return _fsdp(processes, settings, dims)
    if needed is not None and needed[0] == "tensor parallelism":
        return _tensor_parallel(processes, settings, dims)
    if needed is not None:
        label, sizes = needed
        raise not_yet_supported(f"{label} (ParallelismConfig {sizes})",
                                "use ParallelismConfig(dp_replicate_size=...) alone (DDP) meanwhile")
    return _default(processes, settings, dims)


def _sequence_parallelism_needs_deepspeed(dims, asked) -> ValueError:
    """sp_size > 1 is DeepSpeed's ALST / Ulysses: refused, before any engine, without a DeepSpeed selection."""
    other = f" ({asked[1]} selects {asked[0].label} instead)" if asked is not None else ""
    return ValueError(
        f"ParallelismConfig(sp_size={dims.sp}) is DeepSpeed sequence parallelism (ALST / Ulysses), which needs "
        f"DeepSpeed{other}: pass deepspeed_plugin=DeepSpeedPlugin(...) to the Accelerator, or launch with hasten "
        "launch --use_deepspeed (a config file's distributed_type: DEEPSPEED).")


def _default(processes, settings, dims) -> Strategy:
    """One device, or DDP over every process."""
    if processes.distributed_type == DistributedType.NO:
        return SingleDeviceStrategy(processes, settings, dims)
    return DDPStrategy(processes, settings, dims)
