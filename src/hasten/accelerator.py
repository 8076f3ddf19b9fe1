"""The ``Accelerator``: the front door that composes configuration, process state, a strategy, precision,
data loading and the training-loop helpers.

It holds no backend logic: whatever differs between single-device, DDP, FSDP or DeepSpeed lives in a
``Strategy`` (``hasten/strategies``). Methods here validate input, keep track of prepared objects and delegate.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys
import warnings
import weakref
from typing import IO, TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Iterator, Optional, Union

import torch
from torch import nn

from .accumulation import GradientAccumulator
from .checkpointing.serialization import save as _save
from .collectives import operations
from .compile import apply_dynamo_plugin, remove_regional_compilation
from .config.accelerator_settings import SPLIT_BATCHES_UNSET, resolve_accelerator_settings
from .config.booleans import parse_bool
from .config.kwargs import AutocastKwargs, InitProcessGroupKwargs, ProfileKwargs
from .core.imports import is_bitsandbytes_multi_backend_available, is_xpu_available
from .core.lazy import build_table, lazy_exports
from .core.memory import release_memory
from .evaluation import gather_for_metrics as _gather_for_metrics
from .logging import get_logger
from .optimizer import AcceleratedOptimizer
from .parallel import ParallelDims, resolve_parallelism_config
from .scheduler import AcceleratedScheduler
from .state import AcceleratorState, GradientState, PartialState
from .strategies import select_strategy
from .strategies.deepspeed.wrappers import (  # noqa: F401 - Accelerate's names in this module, as with deepspeed installed
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
)

if TYPE_CHECKING:
    from torch.distributed.algorithms.join import Joinable
    from torch.distributed.device_mesh import DeviceMesh
    from torch.optim.lr_scheduler import LRScheduler
    from torch.utils.data import DataLoader
    from torch.utils.hooks import RemovableHandle

    from .checkpointing.targets import CheckpointTargets
    from .config.accumulation import GradientAccumulationPlugin
    from .config.data import DataLoaderConfiguration
    from .config.deepspeed import DeepSpeedPlugin
    from .config.dynamo import TorchDynamoPlugin
    from .config.enums import DistributedType, DynamoBackend, RNGType
    from .config.fp8 import AORecipeKwargs, FP8BackendType
    from .config.fsdp import FullyShardedDataParallelPlugin
    from .config.kwargs import KwargsHandler
    from .config.megatron import MegatronLMPlugin
    from .config.project import ProjectConfiguration
    from .core.aliases import NestedData
    from .parallel.config import ParallelismConfig, TorchTensorParallelPlugin
    from .tracking.registry import TrackerEntry

__all__ = ["Accelerator"]

# Names scripts written for Accelerate also import from this module (``from accelerate.accelerator import
# DataLoaderConfiguration``); they resolve, lazily, to hasten's own objects.
__getattr__, _ = lazy_exports(__name__, build_table({
    "hasten.config.data": ["DataLoaderConfiguration"],
    "hasten.config.deepspeed": ["DeepSpeedPlugin"],
    "hasten.config.enums": ["DistributedType", "DynamoBackend", "LoggerType", "PrecisionType", "RNGType"],
    "hasten.config.fsdp": ["FullyShardedDataParallelPlugin"],
    "hasten.config.kwargs": ["GradScalerKwargs", "DistributedDataParallelKwargs", "KwargsHandler"],
    "hasten.parallel.config": ["ParallelismConfig", "TorchTensorParallelPlugin"],
    "hasten.state": ["PartialState"],
    "hasten.data.resume": ["skip_first_batches"],
    "hasten.config.fp8": ["AORecipeKwargs", "FP8RecipeKwargs", "MSAMPRecipeKwargs", "TERecipeKwargs"],
    "hasten.config.accumulation": ["GradientAccumulationPlugin"],
    "hasten.config.megatron": ["MegatronLMPlugin"],
    "hasten.config.project": ["ProjectConfiguration"],
    "hasten.config.dynamo": ["TorchDynamoPlugin"],
}))

_LR_SCHEDULER_TYPES = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def _expected_world_size() -> int:
    """The number of processes of this run, before the process group is set up (``WORLD_SIZE`` from the
    launcher), or the existing state's."""
    if PartialState._shared_state:
        return PartialState().num_processes
    return int(os.environ.get("WORLD_SIZE", "1") or 1)



def _storage_address(parameter: torch.Tensor) -> int:
    """Where a parameter's values live: a DTensor's local shard, or the plain tensor inside a wrapping subclass
    (torchao's float8 weights keep it in ``_tensor``), else the tensor itself."""
    inner = getattr(parameter, "_local_tensor", None)
    if not isinstance(inner, torch.Tensor):
        inner = getattr(parameter, "_tensor", None)
    return (inner if isinstance(inner, torch.Tensor) else parameter).data_ptr()

class Accelerator:
    """Run one training script on one device or many processes; the arguments mirror Accelerate's.

    Settings given here win over the launcher's environment and config file; a contradiction between them is
    an error that names both (see docs/configuration.md). What is not supported yet (TPUs, fp8 with TransformerEngine
    or MS-AMP recipes) raises a clear error instead of being ignored.
    """

    def __init__(self, device_placement: bool = True, split_batches: bool = SPLIT_BATCHES_UNSET,
                 mixed_precision: Optional[str] = None, gradient_accumulation_steps: int = 1, cpu: bool = False,
                 dataloader_config: Optional[DataLoaderConfiguration] = None,
                 deepspeed_plugin: Optional[Union[DeepSpeedPlugin, dict[str, DeepSpeedPlugin]]] = None,
                 fsdp_plugin: Optional[FullyShardedDataParallelPlugin] = None,
                 torch_tp_plugin: Optional[TorchTensorParallelPlugin] = None,
                 megatron_lm_plugin: Optional[MegatronLMPlugin] = None,
                 rng_types: Optional[list[Union[str, RNGType]]] = None,
                 log_with: Optional[Union[TrackerEntry, list[TrackerEntry]]] = None,
                 project_dir: Optional[Union[str, os.PathLike]] = None,
                 project_config: Optional[ProjectConfiguration] = None,
                 gradient_accumulation_plugin: Optional[GradientAccumulationPlugin] = None,
                 step_scheduler_with_optimizer: bool = True, kwargs_handlers: Optional[list[KwargsHandler]] = None,
                 dynamo_backend: Optional[Union[DynamoBackend, str]] = None,
                 dynamo_plugin: Optional[TorchDynamoPlugin] = None,
                 deepspeed_plugins: Optional[Union[DeepSpeedPlugin, dict[str, DeepSpeedPlugin]]] = None,
                 parallelism_config: Optional[ParallelismConfig] = None):
        device_placement = parse_bool(device_placement, "Accelerator(device_placement=...)")
        step_scheduler_with_optimizer = parse_bool(step_scheduler_with_optimizer,
                                                   "Accelerator(step_scheduler_with_optimizer=...)")
        if log_with is not None:
            from .tracking.registry import check_log_with_names

            check_log_with_names(log_with)  # an unknown name lists the known and the installed ones
        from .tracking.session import TrackerSession, logging_dir_of

        # trackers: installed, and a logging directory where one is needed, checked before any state exists
        self._tracking = TrackerSession(log_with, logging_dir_of(project_dir, project_config))
        self.log_with = self._tracking.log_with
        settings = resolve_accelerator_settings(
            mixed_precision=mixed_precision, cpu=cpu, gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_accumulation_plugin=gradient_accumulation_plugin, dynamo_backend=dynamo_backend,
            dynamo_plugin=dynamo_plugin, dataloader_config=dataloader_config, split_batches=split_batches,
            project_dir=project_dir, project_config=project_config, rng_types=rng_types,
            kwargs_handlers=kwargs_handlers,
        )
        self.handlers = settings.handlers
        init_kwargs = {}
        if InitProcessGroupKwargs in self.handlers:
            init_kwargs = {k: v for k, v in self.handlers[InitProcessGroupKwargs].to_kwargs().items() if v is not None}
        parallelism_config = resolve_parallelism_config(parallelism_config)  # argument, else the launcher's
        if parallelism_config is not None:  # sizes that cannot fit fail before any process group exists
            ParallelDims.from_config(parallelism_config, _expected_world_size())
        joined = AcceleratorState.joined_run()  # what a second Accelerator in this process keeps of the first's run
        if (deepspeed_plugin or deepspeed_plugins) and joined["deepspeed_plugins"]:
            raise NotImplementedError(  # the run's engines were built from the first Accelerator's plugins
                "You cannot pass in a `deepspeed_plugin` when creating a second `Accelerator`. Please make sure the "
                "first `Accelerator` is initialized with all the plugins you want to use (deepspeed_plugins={name: "
                "plugin, ...}), then switch with accelerator.state.select_deepspeed_plugin(name).")
        if mixed_precision is None and joined["mixed_precision"] is not None:
            # a second Accelerator that does not ask for a precision keeps the run's (as in the reference)
            settings.mixed_precision = joined["mixed_precision"]
        selected = None  # the DeepSpeed plugin the run has selected, kept by a second Accelerator
        if not any((deepspeed_plugin, deepspeed_plugins, fsdp_plugin, megatron_lm_plugin, torch_tp_plugin)):
            # a second Accelerator given no plugin joins the run's backend, as the reference reads the state's
            deepspeed_plugins, torch_tp_plugin = joined["deepspeed_plugins"], joined["torch_tp_plugin"]
            fsdp_plugin, megatron_lm_plugin = joined["fsdp_plugin"], joined["megatron_lm_plugin"]
            selected = joined["selected_deepspeed_plugin"]
        if not any((deepspeed_plugin, deepspeed_plugins, fsdp_plugin, megatron_lm_plugin, torch_tp_plugin)) \
                and "use_deepspeed" in settings.launcher_switches:
            # DeepSpeed from the launcher (a flag or a config file): the plugin is built here, from its environment,
            # so that the state shows it and a script can edit its deepspeed_config before prepare (diffusers does)
            from .config.deepspeed import DeepSpeedPlugin

            deepspeed_plugin = DeepSpeedPlugin()
        self.state = AcceleratorState(
            mixed_precision=settings.mixed_precision, cpu=settings.cpu,
            dynamo_plugin=settings.dynamo_plugin,
            deepspeed_plugin=deepspeed_plugin or deepspeed_plugins, fsdp_plugin=fsdp_plugin,
            torch_tp_plugin=torch_tp_plugin, megatron_lm_plugin=megatron_lm_plugin,
            parallelism_config=parallelism_config, _from_accelerator=True, **init_kwargs,
        )
        dims = ParallelDims.from_config(parallelism_config, self.state.num_processes)  # validated: sizes fit
        ignored = parallelism_config.ignored_handlers() if parallelism_config is not None else []
        if ignored and self.state.is_main_process:
            warnings.warn("ParallelismConfig: " + "; ".join(
                f"{name}_handler is set but {name}_size is 1, so it is ignored" for name in ignored), stacklevel=2)
        self.strategy = select_strategy(
            PartialState(), settings, dims, deepspeed_plugin=deepspeed_plugin or deepspeed_plugins,
            fsdp_plugin=fsdp_plugin, megatron_lm_plugin=megatron_lm_plugin, torch_tp_plugin=torch_tp_plugin,
        )
        self.strategy.setup()
        self.state.register_run(self.strategy)  # the one write: the state's training facts are views of it
        if selected is not None:
            self.state.select_deepspeed_plugin(selected)
        get_logger(__name__).info("hasten trains with %r", self.strategy)  # which backend really runs (INFO)
        if parallelism_config is not None and self.state.use_distributed:  # the run's one DeviceMesh, built once
            dims.build_mesh(self.device.type)
        self.device_placement = device_placement
        self.precision = self.strategy.precision  # chosen by the strategy, with it
        self.scaler = self.precision.scaler
        self.dynamo_plugin = settings.dynamo_plugin
        self.dataloader_config = settings.dataloader_config
        self.project_configuration = settings.project_config
        self.rng_types = settings.rng_types
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.gradient_state = GradientState(gradient_accumulation_plugin=settings.gradient_accumulation_plugin)
        # a backend's config may set the accumulation steps too (DeepSpeed's): one value, or an error naming both
        self.gradient_accumulation_steps = self.strategy.accumulation_steps(self.gradient_accumulation_steps)
        self._accumulator = GradientAccumulator(self.gradient_state, self.strategy, self.num_processes == 1)
        self._models, self._optimizers, self._schedulers, self._dataloaders = [], [], [], []
        self._custom_objects = []
        self._engine_wrapper = None  # deepspeed_engine_wrapped, made on first use
        # save_state / load_state hooks by RemovableHandle id (an OrderedDict: handles keep a weak reference)
        self._save_model_state_pre_hook = collections.OrderedDict()
        self._load_model_state_pre_hook = collections.OrderedDict()
        self._prepared = weakref.WeakSet()  # objects given to or returned by prepare (ids would be reused)
        self.flag_tensor = None
        self.trackers = []
        self._told_about_scheduler = False

    # ------------------------------------------------------------------ facts
    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def distributed_type(self) -> DistributedType:
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        return self.state.use_distributed

    @property
    def mixed_precision(self) -> str:
        """``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``: the precision this run trains with (its strategy's)."""
        return self.precision.mode

    @property
    def native_amp(self) -> bool:
        return self.precision.native_amp

    @property
    def sync_gradients(self) -> bool:
        """Whether the current batch ends an accumulation cycle (gradients synchronised, optimizer steps)."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state._set_sync_gradients(value)

    @property
    def step(self) -> int:
        """Batches counted by ``accumulate`` in the current accumulation cycle (saved and restored by checkpoints)."""
        return self._accumulator.step

    @step.setter
    def step(self, value: int) -> None:
        self._accumulator.step = int(value)

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"gradient_accumulation_steps must be an int >= 1, got {value!r}.")
        self.gradient_state.plugin_kwargs["num_steps"] = value

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def dispatch_batches(self) -> Optional[bool]:
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        return self.dataloader_config.non_blocking

    @property
    def use_stateful_dataloader(self) -> bool:
        return self.dataloader_config.use_stateful_dataloader

    @property
    def project_dir(self) -> Optional[str]:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> Optional[str]:
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        return self.project_configuration.iteration

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 overflow)."""
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)

    @property
    def multi_device(self) -> bool:
        """Whether several processes each drive one accelerator device (GPU, XPU, NPU ...) as plain data-parallel
        ranks: False on CPUs, as the reference answers (``_data_parallel_processes`` counts CPU processes too)."""
        return self._data_parallel_processes and self.distributed_type.name != "MULTI_CPU"

    @property
    def _data_parallel_processes(self) -> bool:
        """Whether several processes, on accelerators or CPUs, are plain data-parallel ranks (DDP): what
        ``join_uneven_inputs`` and ``ParallelismConfig``'s check of the process count ask."""
        return self.use_distributed and self.distributed_type.name.startswith("MULTI_")

    # The kwargs handlers the run was given, by kind, as the reference's attributes of the same names (read-only)
    ddp_handler = property(lambda self: self._handler("DistributedDataParallelKwargs"))
    scaler_handler = property(lambda self: self._handler("GradScalerKwargs"))
    init_handler = property(lambda self: self._handler("InitProcessGroupKwargs"))
    autocast_handler = property(lambda self: self._handler("AutocastKwargs"))
    profile_handler = property(lambda self: self._handler("ProfileKwargs"))
    fp8_recipe_handler = property(lambda self: self._handler("FP8RecipeKwargs"))
    te_recipe_handler = property(lambda self: self._handler("TERecipeKwargs"))
    msamp_recipe_handler = property(lambda self: self._handler("MSAMPRecipeKwargs"))

    def _handler(self, kind: str):
        """The kwargs handler of class ``kind`` given in ``kwargs_handlers``; None without one."""
        return next((handler for cls, handler in self.handlers.items() if cls.__name__ == kind), None)

    @property
    def ao_recipe_handler(self) -> Optional[AORecipeKwargs]:
        """The ``AORecipeKwargs`` fp8 trains with: the one given, or under ``mixed_precision="fp8"`` the default one
        the run made (torchao is hasten's fp8 library); None otherwise."""
        return self._handler("AORecipeKwargs") or getattr(self.precision, "recipe", None)

    @property
    def fp8_enabled(self) -> bool:
        """Whether the run trains in fp8 (``mixed_precision="fp8"``)."""
        return self.mixed_precision == "fp8"

    @property
    def has_fp8_handler(self) -> bool:
        """Whether an fp8 recipe is in use: one given in ``kwargs_handlers``, or the default one fp8 makes."""
        return self.fp8_enabled or any(cls.__name__.endswith("RecipeKwargs") for cls in self.handlers)

    @property
    def delayed_fp8_autocast(self) -> bool:
        """False: the reference delays fp8 autocast for Transformer Engine only; hasten's fp8 runs on torchao."""
        return False

    @property
    def has_lomo_optimizer(self) -> bool:
        """Whether a prepared optimizer is one of ``lomo_optim``'s (``Lomo``, ``AdaLomo``)."""
        return any(type(getattr(optimizer, "optimizer", optimizer)).__module__.startswith("lomo_optim")
                   for optimizer in self._optimizers)

    @property
    def deepspeed_plugin(self) -> Optional[DeepSpeedPlugin]:
        """The active ``DeepSpeedPlugin``; None when DeepSpeed is not in use."""
        return self.state.deepspeed_plugin

    @property
    def is_fsdp2(self) -> bool:
        return self.state.is_fsdp2

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """Whether the model uses torch's composable parallelism APIs (FSDP2)."""
        return self.is_fsdp2

    @property
    def parallelism_config(self) -> Optional[ParallelismConfig]:
        """The ``ParallelismConfig`` of N-D parallelism; None without one."""
        return self.state.parallelism_config

    @property
    def torch_device_mesh(self) -> Optional[DeviceMesh]:
        """The ``DeviceMesh`` of N-D parallelism; None without ``parallelism_config``."""
        return self.state.device_mesh

    @property
    def should_save_model(self) -> bool:
        """Whether this process writes model files (the local main process without N-D parallelism)."""
        return self.state.is_local_main_process if self.parallelism_config is None else True

    # Ranks along each dimension of the layout (``strategy.layout``); without a ParallelismConfig every process
    # is one data-parallel rank and its rank along each model-parallel dimension is 0.
    @property
    def tensor_parallel_rank(self) -> int:
        return self.strategy.layout.tp_rank

    @property
    def pipeline_parallel_rank(self) -> int:
        return self.strategy.layout.pp_rank

    @property
    def context_parallel_rank(self) -> int:
        return self.strategy.layout.cp_rank

    @property
    def data_parallel_shard_rank(self) -> int:
        return self.strategy.layout.dp_shard_rank

    @property
    def data_parallel_rank(self) -> int:
        """This process's rank among the data-parallel ranks (its process index without model parallelism)."""
        return self.strategy.layout.dp_rank

    @property
    def fp8_backend(self) -> FP8BackendType:
        """The library running fp8 training: ``FP8BackendType.AO`` (torchao) with ``mixed_precision="fp8"``, else
        ``FP8BackendType.NO``."""
        return self.precision.fp8_backend

    def __getstate__(self) -> dict:
        # The set of prepared objects holds weak references, which do not pickle; it is rebuilt from the
        # prepared objects the Accelerator keeps (so they still come back unchanged from prepare()).
        state = self.__dict__.copy()
        state.pop("_prepared", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._prepared = weakref.WeakSet()
        for group in (self._models, self._optimizers, self._schedulers, self._dataloaders):
            for prepared in group:
                try:
                    self._prepared.add(prepared)
                except TypeError:  # not weak-referenceable: it will simply be prepared again if given again
                    pass

    def __repr__(self) -> str:
        return f"Accelerator({self.strategy!r}, mixed_precision={self.mixed_precision!r})"

    # ------------------------------------------------------------------ preparing objects
    def prepare(self, *args: Any, device_placement: Optional[list[Optional[bool]]] = None) -> Any:
        """Prepare models, optimizers, schedulers and data loaders, in any order and number.

        Returns them in the order given (a single object is returned alone). Objects that are already prepared,
        and objects prepare() does not handle (None, lists, dicts, anything else), come back unchanged.
        ``device_placement`` (a list of bools, one per object) overrides the Accelerator's setting for models and
        optimizers.
        """
        _ = self.state.device  # after AcceleratorState._reset_state() this raises the reference's error, up front
        if device_placement is None:
            device_placement = [None] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(f"device_placement has {len(device_placement)} entries for {len(args)} objects; give "
                             "one bool per object passed to prepare().")
        result = list(args)
        for obj in args:  # prepared by another Accelerator (one before a reset): kept as it is, and known here
            if self._kind(obj) is not None and obj not in self._prepared and self._is_prepared(obj):
                self._remember(obj, self._registry(self._kind(obj)))
        fresh = [i for i, obj in enumerate(args) if self._kind(obj) is not None and not self._is_prepared(obj)]
        kinds = {i: self._kind(args[i]) for i in fresh}
        # a backend refuses what it cannot take before anything is prepared
        self.strategy.check_prepare(*([args[i] for i in fresh if kinds[i] == kind]
                                      for kind in ("model", "optimizer", "scheduler")))

        for i in fresh:
            if kinds[i] == "data_loader":
                result[i] = self.prepare_data_loader(args[i], device_placement=device_placement[i])

        model_ids = [i for i in fresh if kinds[i] == "model"]
        optimizer_ids = [i for i in fresh if kinds[i] == "optimizer"]
        if model_ids or optimizer_ids:
            models, optimizers = self._prepare_training(
                [args[i] for i in model_ids], [args[i] for i in optimizer_ids],
                [self._placement(device_placement[i]) and not self.verify_device_map(args[i]) for i in model_ids],
                [self._placement(device_placement[i]) for i in optimizer_ids],
                schedulers=[args[i] for i in fresh if kinds[i] == "scheduler"],
            )
            for i, model in zip(model_ids, models):
                result[i] = model
            for i, optimizer in zip(optimizer_ids, optimizers):
                result[i] = optimizer
            if model_ids:  # loaders prepared with the model are fed to its sequence-parallel group (DeepSpeed SP)
                for i in fresh:
                    if kinds[i] == "data_loader":
                        result[i] = self.strategy.sequence_parallel_loader(result[i], result[model_ids[0]])

        for i in fresh:
            if kinds[i] == "scheduler":
                result[i] = self.prepare_scheduler(args[i])
        return result[0] if len(result) == 1 else tuple(result)

    @staticmethod
    def _kind(obj) -> Optional[str]:
        """What prepare() does with ``obj``; None: nothing (it is returned as given, as Accelerate does)."""
        if isinstance(obj, nn.Module):
            return "model"
        if isinstance(obj, (torch.optim.Optimizer, DummyOptim)):
            return "optimizer"
        if isinstance(obj, (_LR_SCHEDULER_TYPES, AcceleratedScheduler, DummyScheduler)):
            return "scheduler"
        if isinstance(obj, torch.utils.data.DataLoader):
            return "data_loader"
        return None

    @property
    def deepspeed_config(self) -> dict:
        """The DeepSpeed config the last engine was built from, its "auto" values filled (after ``prepare`` under
        DeepSpeed; before that, or under another backend, there is none: AttributeError, as in the reference)."""
        config = getattr(self.strategy, "deepspeed_config", None)
        if config is None:
            raise AttributeError("'Accelerator' object has no attribute 'deepspeed_config': it exists after "
                                 "prepare() built a DeepSpeed engine.")
        return config

    @property
    def deepspeed_engine_wrapped(self) -> Optional[DeepSpeedEngineWrapper]:
        """The first DeepSpeed engine this Accelerator prepared, in a ``DeepSpeedEngineWrapper`` (its ``engine``;
        ``backward(loss, sync_gradients)`` runs the engine's backward and, at a boundary, its step), as the
        reference keeps it; None before ``prepare`` built an engine, and under the other backends. The same
        wrapper each time; an assigned wrapper replaces it (after None, the next read wraps the first engine
        again)."""
        if self._engine_wrapper is None:
            engine = self.strategy.first_engine(self._models)
            if engine is not None:
                self._engine_wrapper = DeepSpeedEngineWrapper(engine)
        return self._engine_wrapper

    @deepspeed_engine_wrapped.setter
    def deepspeed_engine_wrapped(self, wrapper: Optional[DeepSpeedEngineWrapper]) -> None:
        self._engine_wrapper = wrapper

    def _is_prepared(self, obj) -> bool:
        return (isinstance(obj, (AcceleratedOptimizer, AcceleratedScheduler)) or obj in self._prepared
                or getattr(obj, "_is_accelerate_prepared", False) is True)

    def _registry(self, kind: str) -> list:
        return {"model": self._models, "optimizer": self._optimizers, "scheduler": self._schedulers,
                "data_loader": self._dataloaders}[kind]

    def _placement(self, value: Optional[bool]) -> bool:
        return self.device_placement if value is None else bool(value)

    def _remember(self, obj, registry: list):
        if obj not in registry:
            registry.append(obj)
        self._prepared.add(obj)
        try:  # the reference's mark, which clients (transformers) read to skip preparing twice
            obj._is_accelerate_prepared = True
        except (AttributeError, TypeError):
            pass
        return obj

    def _prepare_training(self, models, optimizers, model_placement, optimizer_placement, evaluation_mode=False,
                          schedulers=()):
        originals = list(models) + list(optimizers)
        alone = [o for o in optimizers if not self.strategy.trains_prepared_parameters(o, self._models)]
        if alone and not models and self.strategy.prepares_models_with_optimizers:
            raise ValueError(
                f"{type(self.strategy).__name__} prepares each model together with its optimizer, and this "
                f"prepare() call got {len(alone)} optimizer(s) without their model: pass them in one call, "
                "model, optimizer = accelerator.prepare(model, optimizer) (or build the optimizer on the prepared "
                "model's parameters)."
            )
        self._check_optimizers_belong_to_models(models, optimizers)
        if not evaluation_mode:
            self._check_quantized_models(models)
        tied = self.strategy.first_engine(self._models)  # deepspeed_engine_wrapped's engine, if one was built
        models, raw_optimizers = self.strategy.prepare_training(
            models, optimizers, model_placement, evaluation_mode,
            compile_model=lambda model: apply_dynamo_plugin(model, self.dynamo_plugin),
            data_loaders=list(self._dataloaders), schedulers=list(schedulers),
            accumulation_steps=self.gradient_accumulation_steps)
        if tied is not None and self.strategy.first_engine(models) is not None:
            get_logger(__name__).warning(
                "A wrapped DeepSpeed engine reference is currently tied for this `Accelerator()` instance. "
                "accelerator.deepspeed_engine_wrapped stays the first engine prepared; accelerator.backward(loss) "
                "goes to the one engine that trains (has an optimizer); with several, pass backward(loss, "
                "model=engine), or use one Accelerator per trained model.")
        wrapped = [opt if isinstance(opt, AcceleratedOptimizer)  # a backend's own wrapper (DeepSpeed's)
                   else AcceleratedOptimizer(opt, device_placement=place, scaler=self.scaler)
                   for opt, place in zip(raw_optimizers, optimizer_placement)]
        for original in originals:
            self._prepared.add(original)
        return ([self._remember(m, self._models) for m in models],
                [self._remember(o, self._optimizers) for o in wrapped])

    def _check_quantized_models(self, models) -> None:
        """Refuse to train a bitsandbytes model placed where its training fails (quantization/training.py)."""
        quantized = [m for m in models if getattr(m, "hf_device_map", None)
                     and (getattr(m, "is_loaded_in_8bit", False) or getattr(m, "is_loaded_in_4bit", False))]
        if not quantized:
            return
        from .quantization.training import check_quantized_model_trainable

        offload_supported = is_bitsandbytes_multi_backend_available() or is_xpu_available()
        for model in quantized:
            check_quantized_model_trainable(model, distributed=self.state.use_distributed, device=self.device,
                                            offload_supported=offload_supported)

    def _check_optimizers_belong_to_models(self, new_models, optimizers) -> None:
        """Warn about an optimizer that trains no parameter of a prepared model: it may have been built on a copy
        of the model, or its model is prepared later (a GAN prepares each model with its optimizer)."""
        known = {id(p) for model in list(new_models) + self._models for p in model.parameters()}
        if not known:
            return  # no model prepared yet: nothing to compare with
        for optimizer in optimizers:
            if not isinstance(optimizer, torch.optim.Optimizer):
                continue  # a DummyOptim: the DeepSpeed config's optimizer, built on the model's parameters
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if params and not any(id(p) in known for p in params):
                get_logger(__name__).warning(
                    "The %s given to prepare() trains none of the parameters of the model(s) prepared so far. If "
                    "its model is prepared later, that is fine; if it was built on another copy of the model, it "
                    "trains that copy: create it from model.parameters() of the model you pass to prepare().",
                    type(optimizer).__name__,
                )

    def prepare_model(self, model: nn.Module, device_placement: Optional[bool] = None,
                      evaluation_mode: bool = False) -> nn.Module:
        """Prepare one model: mixed-precision forward, device placement, the strategy's wrapper, compilation.

        ``evaluation_mode=True`` prepares a model for inference only (no DDP wrapper).
        """
        if self._is_prepared(model):
            return model
        place = self._placement(device_placement) and not self.verify_device_map(model)  # dispatched: stays put
        models, _ = self._prepare_training([model], [], [place], [],
                                           evaluation_mode=evaluation_mode)
        return models[0]

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer,
                          device_placement: Optional[bool] = None) -> torch.optim.Optimizer:
        """Wrap one optimizer in an ``AcceleratedOptimizer``."""
        if self._is_prepared(optimizer):
            return optimizer
        _, optimizers = self._prepare_training([], [optimizer], [], [self._placement(device_placement)])
        return optimizers[0]

    def prepare_scheduler(self, scheduler: Union[LRScheduler, DummyScheduler, AcceleratedScheduler]
                          ) -> Union[AcceleratedScheduler, LRScheduler, DummyScheduler]:
        """Wrap one learning-rate scheduler in an ``AcceleratedScheduler`` bound to its prepared optimizer."""
        if self._is_prepared(scheduler):
            return scheduler
        target = getattr(scheduler, "optimizer", None)
        optimizers = [opt for opt in self._optimizers if opt.optimizer is target or opt is target
                      or getattr(opt, "client_optimizer", None) is target]
        if target is not None and not optimizers:
            raise ValueError(
                "The scheduler's optimizer has not been prepared: pass the optimizer to prepare() together with (or "
                "before) the scheduler."
            )
        split_batches = self.dataloader_config.split_batches
        data_parallel = self.strategy.data_parallel_size  # the ranks of a tensor-parallel group share one batch
        if not split_batches and data_parallel > 1 and self.step_scheduler_with_optimizer \
                and not self._told_about_scheduler:
            self._told_about_scheduler = True
            get_logger(__name__).info(  # the reference does the same silently: information, not a warning
                "The prepared scheduler advances %d steps per optimizer step (one per data-parallel process), so a "
                "schedule written in single-process steps keeps its meaning. Use "
                "DataLoaderConfiguration(split_batches=True) for one scheduler step per optimizer step.",
                data_parallel,
            )
        owned = self.strategy.engine_scheduler_for(scheduler, optimizers)
        if owned is not None:  # a scheduler a backend's engine built and steps itself (DeepSpeed's DummyScheduler)
            self._prepared.add(scheduler)
            return self._remember(owned, self._schedulers)
        wrapped = AcceleratedScheduler(scheduler, optimizers or self._optimizers,
                                       step_with_optimizer=self.step_scheduler_with_optimizer,
                                       split_batches=split_batches)
        wrapped.data_parallel_size = data_parallel
        self._prepared.add(scheduler)
        return self._remember(wrapped, self._schedulers)

    def prepare_data_loader(self, data_loader: DataLoader, device_placement: Optional[bool] = None,
                            slice_fn_for_dispatch: Optional[Callable[..., Any]] = None) -> DataLoader:
        """Shard a ``DataLoader`` across processes (see ``hasten.data.prepare_data_loader``)."""
        if self._is_prepared(data_loader):
            return data_loader
        from .data.prepare import prepare_data_loader

        options = self.dataloader_config.to_kwargs()
        prepared = prepare_data_loader(
            data_loader, device=self.device, num_processes=self.strategy.data_parallel_size,
            process_index=self.strategy.data_parallel_rank,
            put_on_device=self._placement(device_placement), rng_types=list(self.rng_types),
            slice_fn_for_dispatch=slice_fn_for_dispatch, **options,
        )
        self._prepared.add(data_loader)
        self.strategy.note_data_loader(data_loader)
        return self._remember(prepared, self._dataloaders)

    def skip_first_batches(self, dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
        """A loader that starts ``num_batches`` into the current epoch (resuming mid-epoch)."""
        from .data.resume import skip_first_batches

        return skip_first_batches(dataloader, num_batches=num_batches)

    # ------------------------------------------------------------------ the training step
    def backward(self, loss: torch.Tensor, num_items_in_batch: Optional[Union[int, torch.Tensor]] = None,
                 **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled for fp16.

        Token-level losses: pass the *summed* loss of this micro-batch and ``num_items_in_batch``, the number of
        target items (e.g. non-padding tokens) in the whole accumulation cycle on all processes; the gradient is
        then exactly that of one big batch (docs/gradient-accumulation.md). Other ``kwargs`` go to torch's backward.
        """
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"backward() takes the loss tensor, got {type(loss).__name__}.")
        if loss.numel() != 1 and "gradient" not in kwargs:
            raise ValueError(
                f"backward() needs a scalar loss, got a tensor of shape {tuple(loss.shape)}. Reduce it first "
                "(loss.mean() or loss.sum()), or pass gradient=... as torch's backward allows."
            )
        if num_items_in_batch is not None and float(num_items_in_batch) <= 0:
            raise ValueError(f"num_items_in_batch must be > 0, got {num_items_in_batch!r}.")
        # normalisation (accumulation, items over the data-parallel ranks), fp16 scaling: the strategy's. model=:
        # which prepared model the loss came from, when several engines train (DeepSpeed)
        model = kwargs.pop("model", None) or (self._models[0] if len(self._models) == 1 else None)
        self.strategy.backward(loss, model,
                               accumulation_steps=self.gradient_accumulation_steps,
                               num_items_in_batch=num_items_in_batch, sync_gradients=self.sync_gradients, **kwargs)

    def accumulate(self, *models: nn.Module) -> ContextManager[Any]:
        """One batch of gradient accumulation: gradients are synchronised only on the batch that ends a cycle.

        Inside, ``sync_gradients`` says whether this is that batch; the prepared optimizer and scheduler step
        only then. (A context manager: ``with accelerator.accumulate(model): ...``.)
        """
        return self._accumulator.accumulate(models)

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Accumulate gradients locally (no inter-process communication) in the block."""
        with self.strategy.no_sync(model):
            yield

    def trigger_sync_in_backward(self, model: nn.Module) -> ContextManager[Any]:
        """A context in which the next backward synchronises gradients even inside ``no_sync`` (uneven inputs)."""
        return self.strategy.trigger_sync_in_backward(model)

    def autocast(self, autocast_handler: Optional[AutocastKwargs] = None) -> ContextManager[None]:
        """The mixed-precision autocast context (to run code outside the prepared model's forward)."""
        return self.precision.autocast(autocast_handler)

    @contextlib.contextmanager
    def maybe_context_parallel(self, buffers: Optional[list[torch.Tensor]] = None,
                               buffer_seq_dims: Optional[list[int]] = None,
                               no_restore_buffers: Optional[set[torch.Tensor]] = None) -> Iterator[None]:
        """Shard ``buffers`` along their sequence dimension for context parallelism in the block (one training
        step): each rank of a ``cp`` group computes on its slice, attention over the whole sequence (see
        docs/context-parallelism.md). Arguments: ``buffers`` (inputs, labels, position ids ...), their
        ``buffer_seq_dims``, ``no_restore_buffers`` (left sharded after the block).

        Context parallelism needs ``parallelism_config`` with ``cp_size > 1``; without it the block runs
        unchanged (with a one-time warning), so a loop written for it runs everywhere.
        """
        block = self.strategy.context_parallel(buffers, buffer_seq_dims, no_restore_buffers)
        if block is None:
            get_logger(__name__).warning_once(
                "Context parallelism is not enabled (it needs parallelism_config with cp_size > 1): "
                "maybe_context_parallel has no effect."
            )
        with block or contextlib.nullcontext():
            yield

    def loss_parallel(self) -> ContextManager[Any]:
        """The block computing the loss from logits split over the classes (hasten's; a tensor-parallel plan whose
        head is ``"loss_parallel"``): ``F.cross_entropy`` works on each rank's share of the classes, never
        gathering the logits. ``accelerator.backward`` enters it by itself. Without such a head: no effect."""
        return self.strategy.loss_parallel() or contextlib.nullcontext()

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Backward and update in one pass with the prepared LOMO / AdaLomo optimizers (``lomo-optim``)."""
        if learning_rate is None:
            raise ValueError("A learning rate must be passed in order to call backward pass with LOMO optimizers.")
        lomo = sys.modules.get("lomo_optim")
        kinds = tuple(getattr(lomo, name) for name in ("Lomo", "AdaLomo") if hasattr(lomo, name))
        called = False
        for optimizer in self._optimizers:
            if kinds and isinstance(optimizer.optimizer, kinds):
                optimizer.optimizer.fused_backward(loss, learning_rate)
                called = True
        if not called:
            raise ValueError(
                "Backward pass not properly called on LOMO optimizers: no Lomo or AdaLomo optimizer (lomo-optim) "
                "was passed to prepare(). Prepare one, or call accelerator.backward(loss) for other optimizers."
            )

    def verify_device_map(self, model: nn.Module) -> bool:
        """Whether ``model`` (or a submodule) was dispatched across several devices with a device map."""
        return any(len(getattr(module, "hf_device_map", None) or {}) > 1 for module in model.modules())

    def deepspeed_ulysses_dl_adapter(self, dl: DataLoader, model: nn.Module) -> Iterable[Any]:
        """``dl`` fed to the sequence-parallel group through DeepSpeed's Ulysses adapter (``prepare`` does it for
        loaders prepared with the model; call this for one prepared apart, after the model); ``dl`` itself without
        DeepSpeed sequence parallelism."""
        return self.strategy.sequence_parallel_loader(dl, model)

    def unscale_gradients(self, optimizer: Optional[Union[torch.optim.Optimizer, list[torch.optim.Optimizer],
                                                          tuple[torch.optim.Optimizer, ...]]] = None) -> None:
        """Divide fp16-scaled gradients by the loss scale (done for you before clipping)."""
        if self.scaler is None or not self.sync_gradients:
            return
        optimizers = self._optimizers if optimizer is None else (optimizer if isinstance(optimizer, (list, tuple))
                                                                  else [optimizer])
        self.strategy.unscale_gradients(optimizers)

    def clip_grad_norm_(self, parameters: Union[torch.Tensor, Iterable[torch.Tensor]], max_norm: float,
                        norm_type: float = 2) -> Optional[Union[torch.Tensor, float]]:
        """Clip the gradients' total norm (after unscaling fp16 gradients); returns the norm before clipping.

        While accumulating (``sync_gradients`` False) gradients are partial, so nothing is clipped and None is
        returned; clipping applies on the batch that steps.
        """
        if not self.sync_gradients:
            return None
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type, models=self._models,
                                             optimizers=self._optimizers)

    def clip_grad_value_(self, parameters: Union[torch.Tensor, Iterable[torch.Tensor]], clip_value: float) -> None:
        """Clamp every gradient to ``[-clip_value, clip_value]`` (after unscaling fp16 gradients)."""
        if not self.sync_gradients:
            return
        self.unscale_gradients()
        self.strategy.clip_grad_value_(parameters, clip_value, models=self._models, optimizers=self._optimizers)

    # ------------------------------------------------------------------ processes and evaluation
    # Gathers and reductions run over the data-parallel processes (all of them without model parallelism): the
    # ranks of one tensor/context-parallel group hold the same results, which must count once.
    @torch.no_grad()
    def gather(self, tensor: NestedData) -> NestedData:
        """All-gather (nested) tensors from every data-parallel process, concatenated on dim 0."""
        return operations._gather(tensor, "gather", self.strategy.data_processes())

    def gather_for_metrics(self, input_data: NestedData, use_gather_object: bool = False) -> NestedData:
        """Gather evaluation results, dropping the samples ``even_batches`` duplicated: each sample once."""
        return _gather_for_metrics(input_data, use_gather_object=use_gather_object,
                                   processes=self.strategy.data_processes())

    def reduce(self, tensor: NestedData, reduction: str = "sum", scale: float = 1.0) -> NestedData:
        """Reduce (nested) tensors across the data-parallel processes (and the context-parallel ones, which hold
        one slice of the sequences each): "sum" (default here), "mean", "max", "min" or "none"."""
        return operations._reduce(tensor, reduction, scale, self.strategy.reduction_processes())

    def pad_across_processes(self, tensor: NestedData, dim: int = 0, pad_index: int = 0,
                             pad_first: bool = False) -> NestedData:
        """Pad (nested) tensors on ``dim`` to the largest size across processes, so they can be gathered."""
        return operations.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def split_between_processes(self, inputs: Union[list, tuple, dict, torch.Tensor],
                                apply_padding: bool = False) -> ContextManager[Union[list, tuple, dict, torch.Tensor]]:
        return self.state.split_between_processes(inputs, apply_padding=apply_padding)

    def main_process_first(self) -> ContextManager[None]:
        return self.state.main_process_first()

    def local_main_process_first(self) -> ContextManager[None]:
        return self.state.local_main_process_first()

    def on_main_process(self, function: Optional[Callable[..., Any]] = None) -> Callable[..., Any]:
        return self.state.on_main_process(function)

    def on_local_main_process(self, function: Optional[Callable[..., Any]] = None) -> Callable[..., Any]:
        return self.state.on_local_main_process(function)

    def on_last_process(self, function: Optional[Callable[..., Any]] = None) -> Callable[..., Any]:
        return self.state.on_last_process(function)

    def on_process(self, function: Optional[Callable[..., Any]] = None,
                   process_index: Optional[int] = None) -> Callable[..., Any]:
        return self.state.on_process(function, process_index=process_index)

    def on_local_process(self, function: Optional[Callable[..., Any]] = None,
                         local_process_index: Optional[int] = None) -> Callable[..., Any]:
        return self.state.on_local_process(function, local_process_index=local_process_index)

    def print(self, *args: Any, **kwargs: Any) -> None:
        self.state.print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        self.wait_for_checkpoint()  # a pending save_state(async_save=True) completes first
        self.state.wait_for_everyone()

    def set_trigger(self) -> None:
        """Raise a flag on this process; ``check_trigger`` on every process then sees it (e.g. early stopping)."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """Whether any process called ``set_trigger`` since the last check (collective: call on every process)."""
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        flag = self.reduce(self.flag_tensor, reduction="sum")
        if flag.item() >= 1:
            self.flag_tensor = torch.tensor(0, device=self.device)
            return True
        return False

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: Iterable[Union[nn.Module, Joinable]],
                           even_batches: Optional[bool] = None) -> Iterator[None]:
        """Train on loaders of different lengths across processes without hanging (``torch.distributed.algorithms.Join``).

        ``even_batches`` temporarily overrides the prepared loaders' setting (False lets them stay uneven).
        """
        from torch.distributed.algorithms.join import Join

        joinables = list(joinables)
        # DDP models and other torch Joinables (also behind torch.compile, which forwards their attributes)
        usable = [joinable for joinable in joinables if callable(getattr(joinable, "join_hook", None))]
        if not self._data_parallel_processes:  # a single process, or a sharded backend that has no Join support
            usable = []
            warnings.warn(
                "join_uneven_inputs has no effect " + (
                    "with a single process." if not self.use_distributed else
                    f"with distributed_type={self.distributed_type}: joining uneven inputs is only supported for "
                    "multi-GPU / multi-process DDP training."),
                stacklevel=3,
            )
        elif len(usable) < len(joinables):
            warnings.warn(
                f"join_uneven_inputs has no effect on {', '.join(type(j).__name__ for j in joinables if j not in usable)}"
                ": only DistributedDataParallel models (and other torch Joinables) can join uneven inputs.",
                stacklevel=3,
            )
        samplers = []
        if even_batches is not None:
            from .data.dispatcher import DataLoaderDispatcher

            loaders = [loader for loader in self._dataloaders
                       if not isinstance(loader, DataLoaderDispatcher)]  # dispatch reads on one process only
            samplers = [(sampler, sampler.even_batches) for sampler in
                        (getattr(loader, "batch_sampler", None) for loader in loaders)
                        if hasattr(sampler, "even_batches")]
            if any(isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset)
                   for loader in self._dataloaders):
                warnings.warn(
                    f"join_uneven_inputs(even_batches={even_batches}): overriding even_batches is only supported for "
                    "map-style datasets; prepared loaders over iterable datasets keep their own setting "
                    "(DataLoaderConfiguration(even_batches=...)).", UserWarning, stacklevel=3,
                )
            for sampler, _ in samplers:
                sampler.even_batches = even_batches
        try:
            if usable:
                with Join(usable):
                    yield
            else:
                yield
        finally:
            for sampler, value in samplers:
                sampler.even_batches = value

    # ------------------------------------------------------------------ models and memory
    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True,
                     keep_torch_compile: bool = True) -> nn.Module:
        """The user's model without the strategy's wrappers (and, on request, without autocast / compilation)."""
        unwrapped = self.strategy.unwrap(model, keep_fp32_wrapper=keep_fp32_wrapper,
                                         keep_torch_compile=keep_torch_compile)
        if not keep_torch_compile:
            remove_regional_compilation(unwrapped)
        return unwrapped

    def _get_named_parameters(self, *objects, drop_refs: bool = False) -> dict:
        """Every parameter of the modules among ``objects`` (other objects are skipped), by name, as the unwrapped
        model names it. ``drop_refs``: the address of each parameter's storage instead of the parameter (a DTensor's
        local shard, a wrapping tensor subclass's inner tensor), which identifies it across a re-wrap without
        keeping it alive. Private in the reference too; scripts remap optimizer parameters with it."""
        found: dict = {}
        for obj in objects:
            if not isinstance(obj, nn.Module):
                continue
            for name, parameter in self.strategy.unwrap(obj).named_parameters():
                found[name] = _storage_address(parameter) if drop_refs else parameter
        return found

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict:
        """The model's full state dict, as the strategy gathers it (the real weights of a model dispatched with
        CPU or disk offload). ``unwrap=False``: the wrapper's own ``state_dict()``."""
        if not unwrap:
            return model.state_dict()
        from .checkpointing.save_model import full_state_dict

        return full_state_dict(self.strategy, model)

    def free_memory(self, *objects: Any) -> list:
        """Drop the Accelerator's references to prepared objects and free device memory; returns ``objects`` freed."""
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self._prepared.clear()
        self._accumulator.step = 0
        self.strategy.forget()
        return release_memory(*objects)

    def clear(self, *objects: Any) -> list:
        """Alias of ``free_memory``."""
        return self.free_memory(*objects)

    def find_executable_batch_size(self, function: Optional[Callable[..., Any]] = None, starting_batch_size: int = 128,
                                   reduce_batch_size_fn: Optional[Callable[[], int]] = None) -> Callable[..., Any]:
        """``find_executable_batch_size`` that also frees this Accelerator's prepared objects before each retry."""
        from .core.memory import find_executable_batch_size

        if function is None:
            return functools.partial(self.find_executable_batch_size, starting_batch_size=starting_batch_size,
                                     reduce_batch_size_fn=reduce_batch_size_fn)

        @functools.wraps(function)
        def run(batch_size, *args, **kwargs):
            self.free_memory()
            return function(batch_size, *args, **kwargs)

        return find_executable_batch_size(run, starting_batch_size=starting_batch_size,
                                          reduce_batch_size_fn=reduce_batch_size_fn)

    # ------------------------------------------------------------------ checkpointing (hasten/checkpointing)
    def save_state(self, output_dir: Optional[Union[str, os.PathLike]] = None, safe_serialization: bool = True, *,
                   async_save: bool = False, **save_model_func_kwargs: Any) -> str:
        """Save models, optimizers, schedulers, loader positions, scaler, random states, the accumulation step
        and registered objects to a folder, atomically; returns the folder.

        With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` the folder is
        ``{project_dir}/checkpoints/checkpoint_{iteration}`` and at most ``total_limit`` are kept. The file
        layout is the reference library's (docs/checkpointing.md). ``safe_serialization``: models as
        safetensors (else pickled ``.bin``).

        ``async_save=True``: return once the state is copied to CPU memory and write the files in the background
        while training continues; the checkpoint becomes complete (marker last) when they are all on disk. The
        next ``save_state`` / ``load_state`` / ``wait_for_everyone`` / ``wait_for_checkpoint`` waits for it.
        """
        from .checkpointing import save_state

        return save_state(self.strategy, self.checkpoint_targets(), self.project_configuration, output_dir,
                          safe_serialization=safe_serialization, async_save=async_save, **save_model_func_kwargs)

    def wait_for_checkpoint(self) -> Optional[str]:
        """Wait until a ``save_state(async_save=True)`` of this process is complete on disk; returns its folder
        (None when no save was pending). Raises ``CheckpointError`` if it failed: the previous checkpoint is then
        still the newest. Call it on every process."""
        from .checkpointing.async_save import wait_for_pending

        return wait_for_pending()

    def load_state(self, input_dir: Optional[Union[str, os.PathLike]] = None, load_kwargs: Optional[dict] = None,
                   **load_model_func_kwargs: Any) -> str:
        """Restore what ``save_state`` saved; returns the folder loaded.

        ``input_dir`` defaults to the newest *complete* automatic checkpoint. ``load_kwargs`` go to
        ``torch.load`` (``{"weights_only": False}`` accepts pickles of arbitrary objects: trusted files only);
        ``strict=`` and ``map_location=`` ("cpu" or "on_device") apply to the models.
        """
        from .checkpointing import load_state

        self.wait_for_checkpoint()
        return load_state(self.strategy, self.checkpoint_targets(), self.project_configuration, input_dir,
                          load_kwargs=load_kwargs, **load_model_func_kwargs)

    def save_model(self, model: nn.Module, save_directory: Union[str, os.PathLike],
                   max_shard_size: Union[int, str] = "10GB", safe_serialization: bool = True) -> None:
        """Save ``model``'s weights (sharded safetensors + index when larger than ``max_shard_size``; tied
        weights once) in the layout ``load_checkpoint_in_model`` and other libraries read."""
        from .checkpointing import save_model

        save_model(self.strategy, model, save_directory, max_shard_size=max_shard_size,
                   safe_serialization=safe_serialization,
                   save_on_each_node=self.project_configuration.save_on_each_node)

    def checkpoint_targets(self) -> CheckpointTargets:
        """What ``save_state`` / ``load_state`` save and restore, as one explicit ``CheckpointTargets``: the
        prepared models, optimizers, schedulers and loaders in preparation order, the scaler, registered
        objects, the accumulation step and the save / load hooks."""
        from .checkpointing.targets import CheckpointTargets

        def set_step(step: int) -> None:
            self._accumulator.step = int(step)

        return CheckpointTargets(
            models=list(self._models), optimizers=list(self._optimizers), schedulers=list(self._schedulers),
            dataloaders=list(self._dataloaders), scaler=self.scaler, custom_objects=list(self._custom_objects),
            step=self._accumulator.step, set_step=set_step,
            save_hooks=list(self._save_model_state_pre_hook.values()),
            load_hooks=list(self._load_model_state_pre_hook.values()), device=self.device,
        )

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore ``objects`` (each with ``state_dict()`` / ``load_state_dict()``) with the state."""
        from .checkpointing.targets import check_registrable

        self._custom_objects.extend(check_registrable(objects))

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in ``save_state`` before files are written; returns a handle
        whose ``remove()`` unregisters it. ``weights`` are the models' state dicts (remove one to skip saving it);
        ``output_dir`` is the folder being written (it becomes the checkpoint when the save completes)."""
        from torch.utils.hooks import RemovableHandle

        if not callable(hook):
            raise TypeError(f"register_save_state_pre_hook takes a function, got {type(hook).__name__}.")
        handle = RemovableHandle(self._save_model_state_pre_hook)
        self._save_model_state_pre_hook[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in ``load_state`` before anything is loaded (remove a model from the
        list to load it yourself); returns a handle whose ``remove()`` unregisters it."""
        from torch.utils.hooks import RemovableHandle

        if not callable(hook):
            raise TypeError(f"register_load_state_pre_hook takes a function, got {type(hook).__name__}.")
        handle = RemovableHandle(self._load_model_state_pre_hook)
        self._load_model_state_pre_hook[handle.id] = hook
        return handle

    def save(self, obj: Any, f: Union[str, os.PathLike, IO[bytes]], safe_serialization: bool = False) -> None:
        """Save ``obj`` once per run (or per machine with ``save_on_each_node``), atomically."""
        _save(obj, f, save_on_each_node=self.project_configuration.save_on_each_node,
              safe_serialization=safe_serialization)

    @contextlib.contextmanager
    def profile(self, profile_handler: Optional[ProfileKwargs] = None) -> Iterator[torch.profiler.profile]:
        """Profile the block with ``torch.profiler``; with ``output_trace_dir`` a Chrome trace per process is written."""
        handler = profile_handler or self.handlers.get(ProfileKwargs) or ProfileKwargs()
        profiler = handler.build()
        with profiler as prof:
            yield prof
        if handler.output_trace_dir:
            import os

            os.makedirs(handler.output_trace_dir, exist_ok=True)
            prof.export_chrome_trace(os.path.join(handler.output_trace_dir,
                                                  f"trace_rank{self.process_index}.json"))
        self.wait_for_everyone()

    # ------------------------------------------------------------------ trackers (the logic: hasten/tracking/session.py)
    def init_trackers(self, project_name: str, config: Optional[dict] = None,
                      init_kwargs: Optional[dict[str, dict[str, Any]]] = None) -> None:
        """Start the trackers given by ``log_with`` with ``config`` as the run's hyperparameters. Arguments:
        ``project_name``, ``config=None``, ``init_kwargs=None`` (``{tracker name: {keyword: value}}`` for the
        trackers' constructors). Call it on every process (trackers run on the main process only unless their
        ``main_process_only`` is False), or on the main process alone, as the reference allows. Files go under ``project_configuration.logging_dir``."""
        self.trackers = self._tracking.start(project_name, config, init_kwargs, self.logging_dir,
                                             self.is_main_process)
        self.tracker_project_name = project_name
        self.tracker_config = dict(config or {})

    def log(self, values: dict, step: Optional[int] = None, log_kwargs: Optional[dict] = None) -> None:
        """Log ``values`` (numbers, strings, tensors of one element) at ``step`` to every tracker of this process.
        ``log_kwargs``: ``{tracker name: {keyword: value}}``. An error for a value that is not loggable (its key
        named), and on the main process before ``init_trackers``; on the other processes, with the trackers started
        on the main process only, it does nothing (as the reference)."""
        self._tracking.log(self.trackers, values, step, log_kwargs, self.is_main_process)

    def end_training(self) -> None:
        """Finish this process's trackers once this process's pending asynchronous save is on disk. It waits for
        no other process, so it is safe on the main process alone (``if accelerator.is_main_process:``)."""
        self.wait_for_checkpoint()
        self._tracking.finish(self.trackers)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its underlying run object with ``unwrap``); on a process where it does not
        run, a blank tracker whose methods do nothing."""
        return self._tracking.get(self.trackers, name, unwrap)
