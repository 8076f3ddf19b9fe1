"""The strategy protocol: everything that differs between training backends, behind one interface.

The ``Accelerator`` composes a strategy with the shared rooms (configuration, data, checkpointing) and never
branches on the backend itself. A strategy is given the run's settings, its layout and the processes
(``PartialState``: device, ranks), never the process-wide training state, and owns:

- its **precision** (``create_precision``: autocast and the fp16 scaler by default; a backend with its own
  policy, such as FSDP2's ``MixedPrecisionPolicy`` or DeepSpeed's engine, returns its own object);
- the **layout** (``layout``: a ``ParallelDims``) that data sharding, gathers, reductions and the loss
  normalisation ask for the data-parallel rank and size;
- the **preparation order** of model wrappers (``prepare_training``: models and optimizers together);
- the **training step**: ``backward``, ``no_sync``, gradient unscaling and clipping (given models and optimizers);
- **state dicts** (model, and optimizer given its model) and **checkpoint IO** (``checkpoint_io``: what is
  written inside the staging folder; the transaction around it is the same for every strategy).

Adding a backend means adding one folder under ``strategies/`` whose strategy overrides what the backend changes,
and one row in ``_BACKENDS`` (``strategies/select.py``).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Optional, Sequence, TYPE_CHECKING, Union

import torch
from torch import nn

from ..checkpointing.checkpoint_io import FullStateCheckpointIO, Snapshot
from ..config.enums import DistributedType
from ..config.fp8 import AORecipeKwargs
from ..config.kwargs import AutocastKwargs, GradScalerKwargs
from ..core.aliases import Device
from ..core.modules import extract_model_from_parallel

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.utils.data import DataLoader

    from ..checkpointing.targets import CheckpointTargets
    from ..collectives.process_view import ProcessView
    from ..config.accelerator_settings import AcceleratorSettings
    from ..parallel import ParallelDims
    from ..precision.base import Precision
    from ..scheduler import AcceleratedScheduler
    from ..state import PartialState


class Strategy:
    """Base strategy: one process, plain ``nn.Module``; subclasses override what their backend changes."""

    #: the DistributedType this strategy implements
    distributed_type: DistributedType = DistributedType.NO
    #: whether models and the optimizers that train them must be given to the same ``prepare()`` call (a
    #: backend that builds one engine from both, or re-points the optimizer at new, sharded parameters)
    prepares_models_with_optimizers: bool = False
    #: how state becomes files in the staging folder and back (``checkpointing/checkpoint_io.py``)
    checkpoint_io = FullStateCheckpointIO()
    #: whether one process holds the whole state, so the main process writes a complete checkpoint alone and the
    #: others only add their own files, if they call ``save_state`` at all (``checkpointing/participation.py``)
    saves_from_one_process: bool = True
    #: whether ``save_state(async_save=True)`` may write in a background thread (an engine that writes its own
    #: files collectively cannot)
    supports_async_save: bool = True
    #: the keyword arguments ``save_state(**save_model_func_kwargs)`` may pass to the backend's own checkpoint
    #: function (given to its checkpoint IO's ``collect`` with each save); none by default
    save_options_accepted: tuple = ()

    def __init__(self, processes: PartialState, settings: Optional[AcceleratorSettings] = None,
                 dims: Optional[ParallelDims] = None):
        from ..config.accelerator_settings import AcceleratorSettings

        self.processes = processes  # the process facts (PartialState): device, ranks, counts
        #: the run's settings, resolved once by the Accelerator (``AcceleratorSettings``): precision, kwargs handlers
        self.settings = settings if settings is not None else AcceleratorSettings()
        self.handlers = self.settings.handlers
        self._dims = dims
        self._views = {}  # ProcessViews of the data-parallel (and dp x cp) groups, under model parallelism
        self.precision = self.create_precision()

    # ------------------------------------------------------------ precision and layout
    def create_precision(self) -> Precision:
        """The precision this backend trains with, chosen together with it (autocast + fp16 scaler here, of
        ``grad_scaler_class``)."""
        from ..precision import autocast_precision

        return autocast_precision(self.settings.mixed_precision, self.processes.device,
                                  scaler_kwargs=self.handlers.get(GradScalerKwargs),
                                  autocast_kwargs=self.handlers.get(AutocastKwargs),
                                  scaler_class=self.grad_scaler_class(),
                                  fp8_recipe=self.handlers.get(AORecipeKwargs))

    def state_views(self) -> dict:
        """What ``AcceleratorState`` shows of this run: its ``mixed_precision`` (the precision object's mode) and,
        for the backends scripts check by name, ``distributed_type`` and the backend's plugin (``fsdp_plugin``,
        ``megatron_lm_plugin``); without a ``distributed_type`` here the state shows the processes' kind (one device,
        DDP). A subclass adds its entries to these."""
        return {"mixed_precision": self.precision.mode}

    def select_deepspeed_plugin(self, name: Optional[str]) -> None:
        """Make a named DeepSpeed plugin the one the next engine is built with: only a DeepSpeed run has several."""
        raise ValueError(f"{type(self).__name__} builds no DeepSpeed engine: select_deepspeed_plugin needs an "
                         "Accelerator created with deepspeed_plugins={name: DeepSpeedPlugin(...), ...}.")

    def selected_deepspeed_plugin(self) -> Optional[str]:
        """The name of the DeepSpeed plugin the next engine is built with; None without several named ones."""
        return None

    def grad_scaler_class(self) -> Optional[type]:
        """The class of the fp16 gradient scaler: None, torch's ``GradScaler``; a sharded backend returns one that
        checks every rank's shard for overflow."""
        return None

    @property
    def layout(self) -> ParallelDims:
        """The ``ParallelDims`` of this run: without a ParallelismConfig, every process is one data-parallel rank."""
        if self._dims is None:
            from ..parallel import ParallelDims

            self._dims = ParallelDims.from_config(None, self.processes.num_processes)
        return self._dims

    def data_processes(self) -> Optional[ProcessView]:
        """The processes data is split over and results are gathered from: None (the whole run, today's path)
        when every process is its own data-parallel rank, else a ``ProcessView`` of the data-parallel group."""
        layout = self.layout
        return self._processes("dp", layout.dp_size, lambda: layout.dp_group)

    def reduction_processes(self) -> Optional[ProcessView]:
        """The processes ``Accelerator.reduce`` combines: the data-parallel ones, and under context parallelism
        the ranks of each cp group too (each holds the result of one slice of the sequences)."""
        layout = self.layout
        if layout.cp == 1:
            return self.data_processes()
        return self._processes("dp_cp", layout.dp_size * layout.cp, lambda: layout.submesh("dp_cp").get_group())

    def _processes(self, name: str, size: int, group: Callable[[], ProcessGroup]) -> Optional[ProcessView]:
        """None when ``size`` is every process, else the ``ProcessView`` of ``group()``, built once per name
        (gathers and reductions ask for it at every call)."""
        if size == self.processes.num_processes:
            return None
        if name not in self._views:
            from ..collectives.process_view import ProcessView

            self.layout.build_mesh(self.processes.device.type)
            self._views[name] = ProcessView.of_group(group(), self.processes)
        return self._views[name]

    @property
    def data_parallel_size(self) -> int:
        return self.layout.dp_size

    @property
    def data_parallel_rank(self) -> int:
        return self.layout.dp_rank

    # ------------------------------------------------------------ set-up and preparation
    def setup(self) -> None:
        """Create what the backend needs before anything is prepared (process groups, meshes)."""

    def check_prepare(self, models: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
                      schedulers: Sequence[Any]) -> None:
        """Refuse, before anything of a ``prepare()`` call is prepared, objects this backend cannot take together."""

    def trains_prepared_parameters(self, optimizer: torch.optim.Optimizer, models: Sequence[nn.Module]) -> bool:
        """Whether ``optimizer`` may be prepared without its model: every parameter it trains belongs to one of the
        ``models`` prepared already (transformers' Trainer prepares an FSDP model, then builds the optimizer on the
        sharded parameters and prepares it alone). A backend whose engine must own the optimizer says False."""
        prepared = {id(p) for model in models for p in model.parameters()}
        trained = [p for group in getattr(optimizer, "optimizer", optimizer).param_groups for p in group["params"]]
        return bool(trained) and all(id(p) in prepared for p in trained)

    def accumulation_steps(self, requested: int) -> int:
        """The run's gradient accumulation steps, given the Accelerator's (a backend whose own config sets them
        too reconciles the two here, or raises naming both)."""
        return requested

    def prepare_training(self, models: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
                         device_placement: Sequence[bool], evaluation_mode: bool = False,
                         compile_model: Optional[Callable[[nn.Module], nn.Module]] = None,
                         **context: Any) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        """Prepare models and the optimizers that train them, together. Returns ``(models, optimizers)``.

        The order is the strategy's. Here: the precision's forward wrapper, device placement and the backend's
        wrapper (``prepare_model``), then ``compile_model`` (the run's torch.compile settings) on the result.
        Model-parallel backends compile blocks before sharding instead. ``context``: what else the run knows
        (``data_loaders`` prepared so far, the call's ``schedulers``, ``accumulation_steps``), for a backend that
        builds an engine from it.
        """
        prepared = []
        for model, place in zip(models, device_placement):
            before = dict(model.named_parameters())
            converted = self.precision.wrap_forward(model)
            follow_replaced_parameters(optimizers, before, dict(converted.named_parameters()))
            model = self.prepare_model(converted, place, evaluation_mode)
            prepared.append(compile_model(model) if compile_model is not None else model)
        return prepared, [self.prepare_optimizer(o) for o in optimizers]

    def prepare_model(self, model: nn.Module, device_placement: bool = True,
                      evaluation_mode: bool = False) -> nn.Module:
        """Place (and for distributed backends, wrap) one model."""
        if device_placement:
            model = model.to(self.processes.device)
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    def first_engine(self, models: Sequence[nn.Module]) -> Optional[nn.Module]:
        """The first of ``models`` that is an engine of this backend (DeepSpeed's), else None."""
        return None

    def engine_scheduler_for(self, scheduler: Any,
                             optimizers: Sequence[torch.optim.Optimizer]) -> Optional[AcceleratedScheduler]:
        """The prepared scheduler when the backend's engine owns ``scheduler`` (steps it itself), else None."""
        return None

    def forget(self) -> None:
        """Drop what the strategy holds about prepared objects (``Accelerator.free_memory``)."""

    def note_data_loader(self, data_loader: DataLoader) -> None:
        """A user's loader was prepared (a backend may take its batch size; Megatron's plugin does)."""

    def sequence_parallel_loader(self, loader: DataLoader, model: Optional[nn.Module] = None) -> Iterable[Any]:
        """The loader each process iterates under sequence parallelism (DeepSpeed's Ulysses adapter); ``loader``
        itself here."""
        return loader

    def loss_parallel(self) -> Optional[ContextManager]:
        """The context in which a loss runs on logits split over the classes (tensor parallelism with a
        ``"loss_parallel"`` head), or None."""
        return None

    def context_parallel(self, buffers: Optional[Sequence[torch.Tensor]] = None,
                         buffer_seq_dims: Optional[Sequence[int]] = None,
                         no_restore_buffers: Optional[set] = None) -> Optional[ContextManager]:
        """The block of one context-parallel step, or None when this run splits no sequence: None here (a
        ParallelismConfig with ``cp_size`` > 1 selects FSDP2, which has it)."""
        return None

    # ------------------------------------------------------------ the training step
    def normalize_loss(self, loss: torch.Tensor, accumulation_steps: int = 1,
                       num_items_in_batch: Optional[Union[int, torch.Tensor]] = None) -> torch.Tensor:
        """The loss whose gradient is the one of the whole (accumulated, data-parallel) batch.

        With ``num_items_in_batch`` (items of the whole cycle on every data-parallel rank) a summed loss is
        divided by it; the data-parallel size undoes the average the gradient reduction applies. Else the loss
        is divided by the accumulation steps.
        """
        if num_items_in_batch is not None:
            return loss * (self.data_parallel_size / num_items_in_batch)
        if accumulation_steps > 1:
            return loss / accumulation_steps
        return loss

    def backward(self, loss: torch.Tensor, model: Optional[nn.Module] = None, *, accumulation_steps: int = 1,
                 num_items_in_batch: Optional[Union[int, torch.Tensor]] = None, sync_gradients: bool = True,
                 **kwargs: Any) -> None:
        """Normalise, scale (fp16) and back-propagate ``loss``. ``model``: the prepared model it came from when
        there is only one (backends whose engine runs the backward need it); ``sync_gradients``: whether this batch
        ends an accumulation cycle (a backend whose engine keeps its own boundary needs it; torch's gradient sync is
        the ``no_sync`` context's here); ``kwargs`` go to torch's backward."""
        loss = self.normalize_loss(loss, accumulation_steps, num_items_in_batch)
        scaler = self.precision.scaler
        if scaler is not None:
            loss = scaler.scale(loss)
        loss.backward(**kwargs)

    def no_sync(self, model: nn.Module) -> ContextManager:
        """A context in which gradients are accumulated locally, without being synchronised."""
        return contextlib.nullcontext()

    def trigger_sync_in_backward(self, model: nn.Module) -> ContextManager:
        """A context in which the next backward synchronises gradients even inside ``no_sync``."""
        return contextlib.nullcontext()

    def unscale_gradients(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Divide fp16-scaled gradients by the loss scale (before clipping or inspecting them)."""
        scaler = self.precision.scaler
        if scaler is None:
            return
        for optimizer in optimizers:
            scaler.unscale_(getattr(optimizer, "optimizer", optimizer))

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2, *,
                        models: Sequence[nn.Module] = (),
                        optimizers: Sequence[torch.optim.Optimizer] = ()) -> Optional[Union[torch.Tensor, float]]:
        """Clip the total gradient norm of ``parameters``; returns the norm before clipping (a tensor here; an engine
        that clips inside its own step may give a number, or None when it computed none). ``models`` /
        ``optimizers``: the prepared ones (sharded backends reduce the norm over their mesh)."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float, *,
                         models: Sequence[nn.Module] = (), optimizers: Sequence[torch.optim.Optimizer] = ()) -> None:
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # ------------------------------------------------------------ state dicts
    def model_state_dict(self, model: nn.Module, full: bool = True) -> dict:
        """The model's state dict, keyed as the user's module. ``full``: plain, unsharded tensors, complete on
        the main process (a sharded backend gathers them with CPU offload and may return ``{}`` elsewhere)."""
        return self.precision.plain_state_dict(self.unwrap(model).state_dict())

    def load_model_state_dict(self, model: nn.Module, state_dict: dict, strict: bool = True) -> Optional[tuple]:
        """Load ``state_dict`` into ``model``; returns torch's ``(missing_keys, unexpected_keys)`` named tuple, or
        None where the backend's engine reports none."""
        return self.unwrap(model).load_state_dict(state_dict, strict=strict)

    def expected_state_dict(self, model: nn.Module, keep_vars: bool = False) -> dict:
        """The names of the model's full state dict, each with a tensor of its full shape (nothing gathered):
        what a loaded state dict is checked against. Tied names share one tensor."""
        return self.precision.plain_state_dict(self.unwrap(model).state_dict(keep_vars=keep_vars))

    def optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> dict:
        """``optimizer``'s state dict; ``model``: the prepared model it trains (sharded backends need it)."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer,
                                  state_dict: dict) -> None:
        optimizer.load_state_dict(state_dict)

    def optimizer_parameter_names(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
        """The names (in ``model``) of ``optimizer``'s parameters, per group in order: how a state keyed by name
        (a sharded checkpoint's) maps to ``optimizer_state_dict``'s positions."""
        from ..checkpointing.optimizer_names import parameter_names

        return parameter_names(self.unwrap(model), getattr(optimizer, "optimizer", optimizer))

    def optimizer_group_sizes(self, model: Optional[nn.Module], optimizer: torch.optim.Optimizer) -> list[int]:
        """How many parameters each group of ``optimizer`` has in a saved state (``optimizer_state_dict``'s
        layout; a backend that flattens parameters counts the originals)."""
        return [len(group["params"]) for group in optimizer.param_groups]

    # ------------------------------------------------------------ checkpoint IO (inside the staging folder)
    def collect_checkpoint(self, targets: CheckpointTargets, options: Optional[dict] = None) -> Snapshot:
        """Every state to save, in memory (collective for sharded backends). ``options``: this save's
        ``save_model_func_kwargs`` that the backend accepts (``save_options_accepted``), for its checkpoint IO."""
        return self.checkpoint_io.collect(self, targets, options or {})

    def write_checkpoint(self, staging_dir: Path, collected: Snapshot, *, writes_shared_files: bool,
                         process_index: int, safe_serialization: bool = True,
                         process_group: Optional[ProcessGroup] = None) -> None:
        """Write this process's files of ``collected`` into ``staging_dir``. ``process_group``: the group for a
        writer's collectives (an asynchronous save writes from a background thread, on a group of its own)."""
        self.checkpoint_io.write(Path(staging_dir), collected, writes_shared_files=writes_shared_files,
                                 process_index=process_index, safe_serialization=safe_serialization,
                                 process_group=process_group)

    def save_checkpoint(self, staging_dir: Path, targets: CheckpointTargets, *,
                        writes_shared_files: Optional[bool] = None, safe_serialization: bool = True) -> None:
        """Collect and write in one call (``save_state`` runs the two steps inside its transaction)."""
        writes = self.processes.is_main_process if writes_shared_files is None else writes_shared_files
        self.write_checkpoint(staging_dir, self.collect_checkpoint(targets), writes_shared_files=writes,
                              process_index=self.processes.process_index, safe_serialization=safe_serialization)

    def read_checkpoint(self, folder: Path, marker: Optional[dict], targets: CheckpointTargets, *,
                        load_kwargs: Optional[dict] = None, device: Device = "cpu", strict: bool = True) -> Any:
        """Read and check every file this process needs; nothing is applied. Returns what this strategy's checkpoint
        IO read (the full-state IO's ``LoadedState``; an IO of its own may add to it), for ``apply_checkpoint``."""
        return self.checkpoint_io.read(self, Path(folder), marker, targets, load_kwargs=load_kwargs, device=device,
                                       strict=strict)

    def apply_checkpoint(self, loaded: Any, targets: CheckpointTargets, strict: bool = True) -> None:
        """Apply what ``read_checkpoint`` returned (all of it, or none: what was applied is put back)."""
        self.checkpoint_io.apply(self, loaded, targets, strict)

    def load_checkpoint(self, folder: Path, targets: CheckpointTargets, *, load_kwargs: Optional[dict] = None,
                        device: Device = "cpu", strict: bool = True) -> None:
        """Read, check and apply in one call (``load_state`` makes every process agree between the two)."""
        self.apply_checkpoint(self.read_checkpoint(folder, None, targets, load_kwargs=load_kwargs, device=device,
                                                   strict=strict), targets, strict)

    # ------------------------------------------------------------ unwrapping
    def unwrap(self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> nn.Module:
        return extract_model_from_parallel(model, keep_fp32_wrapper=keep_fp32_wrapper,
                                           keep_torch_compile=keep_torch_compile)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.processes.device}, processes={self.processes.num_processes})"


def follow_replaced_parameters(optimizers: Sequence[torch.optim.Optimizer], before: dict[str, nn.Parameter],
                               after: dict[str, nn.Parameter]) -> None:
    """Point ``optimizers`` at the parameters that replaced others of the same name (``before`` / ``after``: a
    model's ``named_parameters()`` around a precision's conversion; torchao's fp8 layers wrap their weight in a new
    Parameter), so that they step the parameters the model trains. State already held moves with its parameter."""
    replaced = {id(old): after[name] for name, old in before.items() if name in after and after[name] is not old}
    if not replaced:
        return
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)
        for group in inner.param_groups:
            group["params"] = [replaced.get(id(param), param) for param in group["params"]]
        for old in [param for param in inner.state if id(param) in replaced]:
            inner.state[replaced[id(old)]] = inner.state.pop(old)
