"""DeepSpeed ZeRO (stages 0-3, CPU / NVMe offload): one engine per model, the engine owning its precision.

``prepare(model, optimizer[, scheduler], loader)`` builds one ``deepspeed.initialize`` engine from the model, its
optimizer (or the config's, through ``DummyOptim``) and the active plugin's config with every ``"auto"`` filled
(``deepspeed/auto_config.py``). The prepared model *is* the engine, as with the reference library.

The training step keeps one accumulation boundary: hasten's ``sync_gradients`` is given to the engine before each
backward (``set_gradient_accumulation_boundary``), so the two never disagree. ``accelerator.backward`` runs
``engine.backward`` on hasten's normalised loss (the engine does not divide it again); the prepared optimizer's
``step()`` runs ``engine.step()`` at the boundary (the engine unscales, clips, steps and zeroes gradients).
``clip_grad_norm_(max_norm)`` at the boundary takes that step with ``max_norm`` as the clipping value and
returns the engine's global norm, so nothing is clipped twice.

Several plugins (``deepspeed_plugins={"student": ..., "teacher": ...}``) make several engines: each ``prepare``
uses the plugin selected with ``AcceleratorState().select_deepspeed_plugin(name)``.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import dataclass, field
from typing import (Any, Callable, ContextManager, Iterable, NoReturn, Optional, Sequence, TYPE_CHECKING, TypeVar,
                    Union, cast)

import torch
from torch import nn

from ...config.enums import DistributedType
from ...core.imports import require_deepspeed
from ...logging import get_logger
from ...precision.engine import EnginePrecision
from ..base import Strategy

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine
    from torch.utils.data import DataLoader

    from ...collectives.process_view import ProcessView
    from ...config.accelerator_settings import AcceleratorSettings
    from ...config.deepspeed import DeepSpeedPlugin
    from ...parallel import ParallelDims
    from ...state import PartialState
    from .wrappers import DeepSpeedSchedulerWrapper

__all__ = ["DeepSpeedStrategy", "deepspeed_required"]

logger = get_logger(__name__)

_Function = TypeVar("_Function", bound=Callable[..., Any])


@dataclass
class _Engine:
    """One engine and what hasten remembers about it."""

    engine: object
    plugin_name: Optional[str]
    names: list = field(default_factory=list)  # the optimizer's parameter names per group, in its order
    client_optimizer: object = None  # the optimizer the user gave (a DummyOptim for the config's)
    scheduler: object = None  # the scheduler the engine built and steps itself (config or lr_scheduler_callable)
    stepped: bool = False  # engine.step() already ran for the current accumulation cycle
    loss_scale: float = 1.0  # sequence parallelism: 1/sp_size where the engine sums gradients over the group


class DeepSpeedStrategy(Strategy):
    """Trains each prepared model through its own DeepSpeed engine."""

    distributed_type = DistributedType.DEEPSPEED
    prepares_models_with_optimizers = True
    saves_from_one_process = False  # the engines write their partitions collectively
    supports_async_save = False

    def trains_prepared_parameters(self, optimizer: torch.optim.Optimizer, models: Sequence[nn.Module]) -> bool:
        return False  # an engine is built from its model and optimizer together
    save_options_accepted = ("exclude_frozen_parameters",)  # engine.save_checkpoint's

    def __init__(self, processes: PartialState, settings: Optional[AcceleratorSettings] = None,
                 dims: Optional[ParallelDims] = None,
                 plugin: Optional[Union[DeepSpeedPlugin, dict[str, DeepSpeedPlugin]]] = None):
        from ...config.accelerator_settings import AcceleratorSettings
        from ...config.deepspeed import DeepSpeedPlugin
        from .auto_config import check_plugin_config

        mixed_precision = (settings or AcceleratorSettings()).mixed_precision
        if plugin is None:
            plugin = DeepSpeedPlugin()  # from the launcher's HASTEN_DEEPSPEED_* environment
        plugins = plugin if isinstance(plugin, dict) else {None: plugin}
        if not plugins:
            raise ValueError("deepspeed_plugins is an empty dict: give at least one DeepSpeedPlugin.")
        for name, value in plugins.items():
            if not isinstance(value, DeepSpeedPlugin):
                raise TypeError(f"deepspeed_plugin{'' if name is None else f's[{name!r}]'} must be a DeepSpeedPlugin, "
                                f"got {type(value).__name__}.")
            check_plugin_config(value.deepspeed_config, processes.device.type, mixed_precision,  # fp16: at prepare
                                what="DeepSpeed config" + ("" if name is None else f" of plugin {name!r}"),
                                engine_precision=False)
            value.set_mixed_precision(mixed_precision)  # the fp16 / bf16 sections; a contradiction raises
        if dims is not None and dims.model_parallel and dims.sp == 1:
            raise ValueError("DeepSpeed here shards over data-parallel ranks only: a ParallelismConfig with tensor, "
                             "context or pipeline parallelism cannot be combined with a DeepSpeedPlugin (sequence "
                             "parallelism, sp_size, can).")
        if processes.device.type == "cpu":  # also on a GPU machine with cpu=True: DeepSpeed must not pick CUDA
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        require_deepspeed()
        from .sequence_parallel import SequenceParallel

        self.sequence_parallel = SequenceParallel.from_layout(dims)  # ALST / Ulysses (sp_size > 1), else None
        self.plugins = plugins
        self._selected = next(iter(plugins))  # the first until a script selects another
        super().__init__(processes, settings, dims)
        self._engines: list = []
        self.deepspeed_config: Optional[dict] = None  # the last engine's config, "auto" filled (prepare sets it)
        from .checkpoint_io import DeepSpeedCheckpointIO

        self.checkpoint_io = DeepSpeedCheckpointIO()

    # ------------------------------------------------------------ precision and set-up
    def create_precision(self) -> EnginePrecision:
        from ...config.fp8 import AORecipeKwargs

        return EnginePrecision(self.settings.mixed_precision, self.processes.device,
                               fp8_recipe=self.handlers.get(AORecipeKwargs))

    def state_views(self) -> dict:
        return {**super().state_views(), "distributed_type": DistributedType.DEEPSPEED}

    def setup(self) -> None:
        deepspeed = require_deepspeed()
        if self.processes.num_processes == 1 and not torch.distributed.is_initialized():
            _single_process_environment()
        deepspeed.init_distributed(dist_backend="gloo" if self.processes.device.type == "cpu" else None,
                                   verbose=False)
        self.select_deepspeed_plugin(next(iter(self.plugins)))

    def select_deepspeed_plugin(self, name: Optional[str]) -> None:
        """Build the next engine with the plugin registered under ``name`` (None: the only one). The plugins'
        ``selected`` flags follow, as scripts written for Accelerate read them."""
        if name not in self.plugins:
            raise ValueError(f"No DeepSpeedPlugin is registered under {name!r}; the registered names are "
                             f"{sorted(map(str, self.plugins))}.")
        from ...config.deepspeed import mark_selected

        self._selected = name
        mark_selected(self.plugins, name)

    def selected_deepspeed_plugin(self) -> Optional[str]:
        return self._selected

    @property
    def plugin(self) -> DeepSpeedPlugin:
        """The selected plugin (``AcceleratorState().select_deepspeed_plugin(name)`` changes it)."""
        return self.plugins[self._selected]

    @property
    def plugin_name(self) -> Optional[str]:
        return self._selected

    # ------------------------------------------------------------ preparation
    def check_prepare(self, models: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
                      schedulers: Sequence[Any]) -> None:
        """Refuse, before anything is built, what one engine cannot take."""
        from .wrappers import DummyOptim, DummyScheduler

        if len(models) > 1:
            raise ValueError(
                f"One prepare() call got {len(models)} models, and a DeepSpeed engine trains one model: prepare each "
                "model in its own call, with its own plugin for different settings (Accelerator(deepspeed_plugins="
                "{'student': ..., 'teacher': ...}) and AcceleratorState().select_deepspeed_plugin(name)).")
        if len(optimizers) > 1:
            raise ValueError(f"One prepare() call got {len(optimizers)} optimizers: a DeepSpeed engine steps one.")
        config = self.plugin.deepspeed_config
        for optimizer in optimizers:  # the reference's sentences first (scripts match on them), then what to do
            if not isinstance(optimizer, DummyOptim) and "optimizer" in config:
                raise ValueError("You cannot specify an optimizer in the config file and in the code at the same "
                                 "time: the DeepSpeed config defines one ('optimizer' section) and a "
                                 f"{type(optimizer).__name__} was given too. Pass hasten.utils.DummyOptim(params) "
                                 "instead, or remove the config's 'optimizer' section.")
            if isinstance(optimizer, DummyOptim) and "optimizer" not in config:
                raise ValueError("You cannot create a `DummyOptim` without specifying an optimizer in the config "
                                 "file. A DummyOptim stands for the config's 'optimizer' section: add one, or pass a "
                                 "torch optimizer.")
        for scheduler in schedulers:
            if not isinstance(scheduler, DummyScheduler) and "scheduler" in config:
                raise ValueError("You cannot specify a scheduler in the config file and in the code at the same "
                                 "time: the DeepSpeed config defines one ('scheduler' section) and a "
                                 f"{type(scheduler).__name__} was given too. Pass hasten.utils.DummyScheduler("
                                 "optimizer) instead, or remove the config's 'scheduler' section.")
            if isinstance(scheduler, DummyScheduler) and "scheduler" not in config \
                    and scheduler.lr_scheduler_callable is None:
                raise ValueError("Either specify a scheduler in the config file or pass in the "
                                 "`lr_scheduler_callable` parameter when using `accelerate.utils.DummyScheduler`. A "
                                 "DummyScheduler stands for the config's 'scheduler' section, and there is none.")
        if any(isinstance(o, DummyOptim) for o in optimizers) and schedulers \
                and not all(isinstance(s, DummyScheduler) for s in schedulers):
            raise ValueError("You can only specify `accelerate.utils.DummyScheduler` in the code when using "
                             "`accelerate.utils.DummyOptim`. The engine builds the optimizer, so a torch scheduler "
                             "would step a placeholder. Use hasten.utils.DummyScheduler(optimizer, ...), with "
                             "lr_scheduler_callable=... for a schedule of your own.")

    def prepare_training(self, models: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
                         device_placement: Sequence[bool], evaluation_mode: bool = False,
                         compile_model: Optional[Callable[[nn.Module], nn.Module]] = None,
                         data_loaders: Sequence[DataLoader] = (), schedulers: Sequence[Any] = (),
                         accumulation_steps: int = 1) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        from .auto_config import resolved_config, write_back_filled_values
        from .wrappers import DummyOptim, DummyScheduler

        self.check_prepare(models, optimizers, schedulers)
        if not models:
            raise ValueError("A DeepSpeed engine is built from a model and its optimizer: pass them to one prepare() "
                             "call, model, optimizer = accelerator.prepare(model, optimizer).")
        deepspeed = require_deepspeed()
        model = models[0]
        optimizer = optimizers[0] if optimizers else None
        scheduler = schedulers[0] if schedulers else None
        plugin = self.plugin
        plugin.set_moe_leaf_modules(model)
        sequence_parallel = self.sequence_parallel
        if sequence_parallel is not None:
            sequence_parallel.check_model(model)  # a model Ulysses cannot split: refused before anything
        config = resolved_config(plugin, model=model, optimizer=optimizer, scheduler=scheduler, loaders=data_loaders,
                                 accumulation_steps=accumulation_steps, data_parallel_size=self._engine_dp_size,
                                 mixed_precision=self.settings.mixed_precision, device_type=self.processes.device.type,
                                 loader_processes=self.data_parallel_size)
        if sequence_parallel is not None:  # checked before DeepSpeed makes its groups and wraps the attention
            sequence_parallel.check_engine_config(config)
            sequence_parallel.register(model, config["train_micro_batch_size_per_gpu"])
        self.deepspeed_config = config  # the last engine's, "auto" filled: Accelerator.deepspeed_config
        write_back_filled_values(plugin.deepspeed_config, config)
        names = _parameter_names(model, optimizer)
        model = self.precision.wrap_forward(model)
        if compile_model is not None:
            model = compile_model(model)
        kwargs = {"model": model, "config": config}
        if sequence_parallel is not None:
            kwargs["mpu"] = sequence_parallel.mpu
        if optimizer is not None and not isinstance(optimizer, DummyOptim):
            offloaded = str((config.get("zero_optimization", {}).get("offload_optimizer") or {}).get(
                "device", "none")).lower() != "none"
            if offloaded:
                from .wrappers import map_pytorch_optim_to_deepspeed

                optimizer = map_pytorch_optim_to_deepspeed(optimizer)
            kwargs["optimizer"] = optimizer
        elif isinstance(optimizer, DummyOptim):
            kwargs["model_parameters"] = optimizer.params
        if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is not None \
                and "scheduler" not in config:
            kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
        stage = config.get("zero_optimization", {}).get("stage", 0)
        originals = ({n: p.detach().clone() for n, p in model.named_parameters()}
                     if stage == 0 and self.precision.dtype is not None and optimizer is not None else {})
        engine, engine_optimizer, _, engine_scheduler = deepspeed.initialize(**kwargs)
        if originals:
            from .engine_state import undo_warmup_step

            undo_warmup_step(engine, originals)
        record = _Engine(engine, self.plugin_name, names, optimizers[0] if optimizers else None,
                         scheduler=engine_scheduler,
                         loss_scale=sequence_parallel.loss_scale(config) if sequence_parallel is not None else 1.0)
        self._engines.append(record)
        prepared_optimizers = []
        if optimizers:
            from .wrappers import DeepSpeedOptimizerWrapper

            prepared_optimizers.append(DeepSpeedOptimizerWrapper(engine_optimizer, strategy=self, engine=engine,
                                                                 client_optimizer=record.client_optimizer))
        return [engine], prepared_optimizers

    def engine_scheduler_for(self, scheduler: Any,
                             optimizers: Sequence[torch.optim.Optimizer]) -> Optional[DeepSpeedSchedulerWrapper]:
        """A ``DummyScheduler`` stands for the scheduler the engine built (from the config, or with its
        ``lr_scheduler_callable``) and steps itself: that one, wrapped so that ``step()`` leaves it to the engine."""
        from .wrappers import DeepSpeedSchedulerWrapper, DummyScheduler

        if not isinstance(scheduler, DummyScheduler):
            return None
        engines = [o.engine for o in optimizers if getattr(o, "engine", None) is not None]
        records = [self._record(e) for e in engines] or [r for r in self._engines if r.client_optimizer is not None]
        built = [r.scheduler for r in records if r.scheduler is not None]
        if not built:
            raise ValueError("The DummyScheduler's engine built no scheduler: the DeepSpeed config has no 'scheduler' "
                             "section and no lr_scheduler_callable was given. Prepare the DummyScheduler in the same "
                             "prepare() call as its model and DummyOptim.")
        return DeepSpeedSchedulerWrapper(built[-1], optimizers)

    def accumulation_steps(self, requested: int) -> int:
        """The Accelerator's steps, or the DeepSpeed config's when it sets them (a number, not "auto"): both set
        and different, the config's, with a warning, as in the reference (transformers' Trainer fills the config
        and accumulates itself)."""
        chosen = requested
        for name, plugin in self.plugins.items():
            value = plugin.hf_ds_config.get_value("gradient_accumulation_steps", "auto")
            if not getattr(plugin, "_accumulation_given", True):
                continue  # a config file without it (the plugin wrote 1): the Accelerator's
            if value == "auto" or value is None or int(value) == chosen:
                continue
            if chosen != 1:
                where = "the DeepSpeed config" + ("" if name is None else f" of plugin {name!r}")
                logger.warning("Gradient accumulation steps mismatch: the Accelerator has %d, %s has %s. Using "
                               "DeepSpeed's value.", chosen, where, value)
            chosen = int(value)
        return chosen

    # ------------------------------------------------------------ sequence parallelism (sequence_parallel.py)
    @property
    def data_parallel_size(self) -> int:
        """Under sequence parallelism every process reads batches of its own (loaders are sharded over all of
        them, as in the reference) and DeepSpeed's adapter hands each batch to the whole group."""
        return self.processes.num_processes if self.sequence_parallel is not None else super().data_parallel_size

    @property
    def data_parallel_rank(self) -> int:
        return self.processes.process_index if self.sequence_parallel is not None else super().data_parallel_rank

    @property
    def _engine_dp_size(self) -> int:
        """DeepSpeed's data-parallel size: the processes over the sequence-parallel size."""
        return self.layout.dp_size if self.sequence_parallel is not None else self.data_parallel_size

    def data_processes(self) -> Optional[ProcessView]:
        return None if self.sequence_parallel is not None else super().data_processes()  # gathers: every process

    def sequence_parallel_loader(self, loader: DataLoader, model: Optional[nn.Module] = None) -> Iterable[Any]:
        """``loader`` through DeepSpeed's ``UlyssesSPDataLoaderAdapter`` under sequence parallelism."""
        if self.sequence_parallel is None:
            return loader
        return self.sequence_parallel.adapt(loader, self.processes.device)

    # ------------------------------------------------------------ engines
    def _record(self, model) -> _Engine:
        for record in self._engines:
            if record.engine is model or record.engine.module is model:
                return record
        raise ValueError("This model was not prepared by this Accelerator's DeepSpeed strategy: pass it to "
                         "accelerator.prepare() first.")

    def first_engine(self, models: Sequence[nn.Module]) -> Optional[DeepSpeedEngine]:
        """The first of ``models`` that is one of the engines built here (``Accelerator.deepspeed_engine_wrapped``)."""
        built = {id(record.engine) for record in self._engines}
        return next((model for model in models if id(model) in built), None)

    def engine_of(self, model: Optional[nn.Module] = None) -> DeepSpeedEngine:
        """The engine of ``model`` (a prepared engine or the module inside it); without a model, the one engine
        that trains (has an optimizer)."""
        if model is not None:
            return self._record(model).engine
        training = [r for r in self._engines if r.client_optimizer is not None]  # (ZeRO-3 inference engines
        # have an optimizer object of their own, managing partitions)
        if len(training) == 1:
            return training[0].engine
        if not training:
            raise ValueError("No DeepSpeed engine with an optimizer was prepared: prepare the model together with its "
                             "optimizer before calling backward().")
        raise ValueError(f"{len(training)} DeepSpeed engines train: say which one, with accelerator.backward(loss, "
                         "model=engine) or by calling backward on the engine.")

    @property
    def engines(self) -> list[DeepSpeedEngine]:
        return [record.engine for record in self._engines]

    def forget(self) -> None:
        """Drop every engine (``Accelerator.free_memory``)."""
        self._engines.clear()

    # ------------------------------------------------------------ the training step
    def backward(self, loss: torch.Tensor, model: Optional[nn.Module] = None, *, accumulation_steps: int = 1,
                 num_items_in_batch: Optional[Union[int, torch.Tensor]] = None, sync_gradients: bool = True,
                 **kwargs: Any) -> None:
        engine_model = kwargs.pop("model", None) or model
        record = self._record(engine_model) if engine_model is not None else self._record(self.engine_of())
        engine = record.engine
        engine.set_gradient_accumulation_boundary(sync_gradients)  # hasten's boundary, given by the Accelerator
        # scale_wrt_gas=False (DeepSpeed's keyword; transformers' Trainer passes it): the loss is divided by the
        # accumulation steps already, so it is not divided again
        if kwargs.pop("scale_wrt_gas", True):
            loss = self.normalize_loss(loss, accumulation_steps, num_items_in_batch)
        elif num_items_in_batch is not None:
            loss = self.normalize_loss(loss, 1, num_items_in_batch)
        if record.loss_scale != 1.0:  # sequence parallelism: the gradients of one process (sequence_parallel.py)
            loss = loss * record.loss_scale
        engine.backward(loss, scale_wrt_gas=False, **kwargs)
        record.stepped = False

    def step(self, engine: DeepSpeedEngine) -> None:
        """The engine's optimizer step for the current accumulation cycle, once."""
        record = self._record(engine)
        if record.stepped:
            return
        record.engine.step()
        record.stepped = True

    def no_sync(self, model: nn.Module) -> ContextManager:
        """The boundary given to the engine before each backward decides when it reduces gradients."""
        return contextlib.nullcontext()

    def unscale_gradients(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """The engine unscales fp16 gradients inside its step."""

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2, *,
                        models: Sequence[nn.Module] = (),
                        optimizers: Sequence[torch.optim.Optimizer] = ()) -> Optional[float]:
        """Take the engine's step with ``max_norm`` as its clipping value; returns the gradients' global norm as a
        Python number (as the reference returns DeepSpeed's), or None when the engine computed none."""
        if float(norm_type) != 2.0:
            raise ValueError(f"DeepSpeed clips by the global 2-norm; clip_grad_norm_ got norm_type={norm_type}.")
        engine = self._clip_target(parameters, models)
        configured = self._configured_clipping()
        if configured is not None and float(configured) != float(max_norm):
            raise ValueError(
                f"The DeepSpeed config sets gradient_clipping={configured} and clip_grad_norm_ asks for max_norm="
                f"{max_norm}: set gradient_clipping to 'auto' in the config (it then follows clip_grad_norm_) or make "
                "both the same.")
        from .engine_state import engine_kind

        engine._config.gradient_clipping = float(max_norm)
        optimizer = engine.optimizer
        if hasattr(optimizer, "clip_grad"):
            optimizer.clip_grad = float(max_norm)
        norm = None
        if engine_kind(engine) == "torch":  # stage 0 in fp32: the gradients are whole and reduced already
            grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, norm_type=2) if grads else torch.tensor(0.0)
        self.step(engine)
        if norm is None:
            norm = engine.get_global_grad_norm()
        return None if norm is None else float(norm)

    def _configured_clipping(self):
        """The clipping value set explicitly (a number, not "auto") in the user's config or the plugin, or None."""
        plugin = self.plugin
        value = plugin.hf_ds_config.get_value("gradient_clipping") if getattr(plugin, "_config_given", False) else None
        if value in (None, "auto"):
            value = plugin.gradient_clipping
        return None if value in (None, "auto") else value

    def _clip_target(self, parameters, models):
        wanted = {id(p) for p in parameters} if not isinstance(parameters, torch.Tensor) else {id(parameters)}
        for record in self._engines:
            if any(id(p) in wanted for p in record.engine.module.parameters()):
                return record.engine
        return self.engine_of()

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float, *,
                         models: Sequence[nn.Module] = (),
                         optimizers: Sequence[torch.optim.Optimizer] = ()) -> NoReturn:
        raise NotImplementedError("DeepSpeed clips by the global norm only: use accelerator.clip_grad_norm_(..., "
                                  "max_norm) (or gradient_clipping in the DeepSpeed config).")

    # ------------------------------------------------------------ state dicts
    def unwrap(self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> nn.Module:
        return super().unwrap(getattr(model, "module", model) if _is_engine(model) else model,
                              keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile)

    def model_state_dict(self, model: nn.Module, full: bool = True) -> dict:
        """The module's weights (16-bit under bf16/fp16, as the engine holds them); ZeRO-3 gathers them."""
        from .engine_state import full_model_state

        if not _is_engine(model):
            return super().model_state_dict(model, full)
        return full_model_state(model)

    def master_model_state_dict(self, model: DeepSpeedEngine) -> dict:
        """The fp32 master weights (what the optimizer updates), whole, on every rank."""
        from .engine_state import full_model_state

        return full_model_state(model, fp32=True)

    def load_model_state_dict(self, model: nn.Module, state_dict: dict, strict: bool = True) -> Optional[tuple]:
        from .engine_state import load_full_state

        if not _is_engine(model):
            return super().load_model_state_dict(model, state_dict, strict)
        load_full_state(model, state_dict, None, [], strict=strict)

    def expected_state_dict(self, model: nn.Module, keep_vars: bool = False) -> dict:
        from .engine_state import expected_model_state

        if not _is_engine(model):
            return super().expected_state_dict(model, keep_vars)
        return expected_model_state(model)

    def optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> dict:
        from .engine_state import full_optimizer_state

        engine = _wrapped_engine(optimizer)
        return full_optimizer_state(engine, self._record(engine).names)

    def load_optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer,
                                  state_dict: dict) -> None:
        from .engine_state import load_full_state

        engine = _wrapped_engine(optimizer)
        load_full_state(engine, None, state_dict, self._record(engine).names)

    def optimizer_parameter_names(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
        return self._record(_wrapped_engine(optimizer)).names

    def optimizer_group_sizes(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> list[int]:
        return [len(group) for group in self.optimizer_parameter_names(model, optimizer)]

    def __repr__(self) -> str:
        stages = {name: p.hf_ds_config.get_value("zero_optimization.stage") for name, p in self.plugins.items()}
        shown = stages[None] if list(stages) == [None] else stages
        return f"DeepSpeedStrategy(zero_stage={shown}, processes={self.processes.num_processes})"


def _is_engine(model) -> bool:
    """Whether ``model`` is a DeepSpeed engine (deepspeed is not imported to answer)."""
    engine_type = getattr(sys.modules.get("deepspeed.runtime.engine"), "DeepSpeedEngine", None)
    return engine_type is not None and isinstance(model, engine_type)


def _wrapped_engine(optimizer):
    engine = getattr(optimizer, "engine", None)
    if engine is None:
        raise ValueError("This optimizer was not prepared under DeepSpeed (it has no engine).")
    return engine


def _parameter_names(model: nn.Module, optimizer) -> list:
    """The names of the optimizer's parameters per group, in its order (a DummyOptim's params too)."""
    from ...checkpointing.optimizer_names import clean_name

    names = {id(p): clean_name(n) for n, p in model.named_parameters()}
    if optimizer is None:
        return []
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:  # DummyOptim: a list of parameters or of groups
        params = list(optimizer.params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
    return [[names.get(id(p), "") for p in group["params"]] for group in groups]


def _single_process_environment() -> None:
    """DeepSpeed needs a process group even on one process: a local one, as torchrun would describe it."""
    from ...core.network import find_free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(find_free_port()))
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)


def deepspeed_required(func: _Function) -> _Function:
    """Decorator: ``func`` raises ValueError when an Accelerator exists that is not configured for DeepSpeed."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ...state import AcceleratorState

        state = AcceleratorState.current()
        if state is not None and state.distributed_type != DistributedType.DEEPSPEED:
            raise ValueError(
                f"{func.__qualname__} needs DeepSpeed, but the Accelerator is configured for "
                f"{state.distributed_type}: create it with a DeepSpeedPlugin first."
            )
        return func(*args, **kwargs)

    return cast(_Function, wrapper)
