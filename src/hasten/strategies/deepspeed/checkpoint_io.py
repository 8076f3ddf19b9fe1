"""Checkpoint IO under DeepSpeed: each engine writes its own checkpoint inside the staging folder.

=============================  ===================================================================
``pytorch_model/``             engine 0's checkpoint (``engine.save_checkpoint(staging, tag)``): the module states
                               and, per rank, the ZeRO partitions of the master weights and optimizer
``pytorch_model_{i}/``         engine ``i``'s (the reference library's layout)
``latest``, ``zero_to_fp32.py``  DeepSpeed's own: ``python zero_to_fp32.py . out`` rebuilds fp32 weights offline
=============================  ===================================================================

Everything else (schedulers, registered objects, random states, loader positions) is written and read by the
full-state IO, inside the same transaction (staging folder, completion marker, rotation) as every strategy.

Loading picks the fastest exact path:

- a DeepSpeed checkpoint with this engine's layout (ZeRO stage, data-parallel size, dtype): ``engine.load_checkpoint``;
- a DeepSpeed checkpoint of another layout: rebuilt into full fp32 weights and optimizer state
  (``checkpointing/deepspeed_files.py``) and scattered into the engine;
- another strategy's checkpoint (full files or DCP shards): read by the full-state reader and scattered likewise.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol, Union

from ...checkpointing.checkpoint_io import Snapshot, take_snapshot, write_full_state
from ...checkpointing.errors import IncompleteCheckpointError
from ...checkpointing.full_state_reader import LoadedState, apply_full_state, read_full_state
from ...checkpointing.targets import CheckpointTargets
from ...checkpointing.deepspeed_files import DeepSpeedCheckpointFormat, check_trusted
from ...checkpointing.strategy_protocol import CheckpointingStrategy

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine
    from torch import nn
    from torch.distributed import ProcessGroup

    from ...core.aliases import Device

__all__ = ["DeepSpeedCheckpointIO", "engine_tag"]

engine_tag = DeepSpeedCheckpointFormat.folder_name  # the folder engine ``index`` writes its checkpoint to


class _EngineStrategy(CheckpointingStrategy, Protocol):
    """The strategy this IO serves (``DeepSpeedStrategy``, which imports this module): it knows each model's engine."""

    def engine_of(self, model: Optional[nn.Module] = None) -> DeepSpeedEngine: ...


@dataclass
class EngineSnapshot(Snapshot):
    """A full-state snapshot without models and optimizers, plus the engines that write those themselves."""

    engines: list = field(default_factory=list)
    options: dict = field(default_factory=dict)  # save_state(**save_model_func_kwargs): engine.save_checkpoint's


@dataclass
class _EngineLoad:
    engine: object
    folder: Path
    tag: str
    optimizer: object = None
    weights: Optional[dict] = None  # None: the engine loads its own checkpoint
    optimizer_state: Optional[dict] = None


@dataclass
class EngineLoadedState:
    rest: LoadedState
    engines: list


def _without_models(targets: CheckpointTargets) -> CheckpointTargets:
    return dataclasses.replace(targets, models=[], optimizers=[], load_hooks=[])


class DeepSpeedCheckpointIO(DeepSpeedCheckpointFormat):
    """DeepSpeed's engine format (``checkpointing/deepspeed_files.py``: its names, how it is recognised and read
    whole), written and read by the engines themselves; the rest in full files."""

    # ------------------------------------------------------------ saving
    def collect(self, strategy: _EngineStrategy, targets: CheckpointTargets,
                options: Optional[dict] = None) -> EngineSnapshot:
        """The non-engine state in memory, the engines to write and ``options`` for ``engine.save_checkpoint``
        (``exclude_frozen_parameters``)."""
        snapshot = take_snapshot(strategy, dataclasses.replace(targets, models=[], optimizers=[]))
        engines = [strategy.engine_of(model) for model in targets.models]
        return EngineSnapshot(**{f.name: getattr(snapshot, f.name) for f in dataclasses.fields(Snapshot)},
                              engines=engines, options=dict(options or {}))

    def write(self, staging: Path, collected: EngineSnapshot, *, writes_shared_files: bool, process_index: int,
              safe_serialization: bool = True, process_group: Optional[ProcessGroup] = None) -> None:
        for index, engine in enumerate(collected.engines):  # collective: every rank writes its partitions
            engine.save_checkpoint(str(staging), tag=engine_tag(index), client_state={}, save_latest=index == 0,
                                   **collected.options)
        rest = Snapshot(**{f.name: getattr(collected, f.name) for f in dataclasses.fields(Snapshot)})
        write_full_state(staging, rest, writes_shared_files=writes_shared_files, process_index=process_index,
                         safe_serialization=safe_serialization)

    # ------------------------------------------------------------ loading
    def read(self, strategy: _EngineStrategy, folder: Path, marker: Optional[dict], targets: CheckpointTargets, *,
             load_kwargs: Optional[dict] = None, device: Device = "cpu",
             strict: bool = True) -> Union[LoadedState, EngineLoadedState]:
        folder = Path(folder)
        if not any(self.model_location(folder, i) is not None for i in range(len(targets.models))):
            return read_full_state(strategy, folder, marker, targets, load_kwargs, device, strict)  # another strategy's
        check_trusted(folder, marker, load_kwargs)
        targets.run_load_hooks(folder, strategy.unwrap)  # every engine loads its own checkpoint
        rest = read_full_state(strategy, folder, marker, _without_models(targets), load_kwargs, device, strict)
        loads = []
        for index, model in enumerate(targets.models):
            engine = strategy.engine_of(model)
            optimizer = next((o for o in targets.optimizers if getattr(o, "engine", None) is engine), None)
            loads.append(self._read_engine(strategy, folder, engine_tag(index), engine, optimizer))
        return EngineLoadedState(rest, loads)

    def _read_engine(self, strategy, folder: Path, tag: str, engine, optimizer) -> _EngineLoad:
        from ...checkpointing.deepspeed_files import read_deepspeed_layout

        path = folder / tag
        if not self.recognises(path):
            raise IncompleteCheckpointError(f"Checkpoint {folder} has no DeepSpeed checkpoint {tag}/ for this engine: "
                                            "load a checkpoint saved with the same prepared models.")
        layout = read_deepspeed_layout(path)
        partitions = getattr(engine, "seq_dp_world_size", engine.dp_world_size)  # x sp_size under sequence parallelism
        if layout["zero_stage"] == engine.zero_optimization_stage() and \
                layout["world_size"] == partitions and layout.get("dtype") == _dtype_name(engine):
            _check_rank_files(path, layout)
            return _EngineLoad(engine, folder, tag, optimizer)
        names = (lambda: strategy.optimizer_parameter_names(engine, optimizer)) if optimizer is not None else None
        weights, optimizer_state = self.read_weights_and_optimizer(path, names)
        return _EngineLoad(engine, folder, tag, optimizer, weights, optimizer_state)

    def apply(self, strategy: _EngineStrategy, loaded: Union[LoadedState, EngineLoadedState],
              targets: CheckpointTargets, strict: bool = True) -> None:
        from .engine_state import load_full_state

        if isinstance(loaded, LoadedState):
            apply_full_state(strategy, loaded, targets, strict)
            return
        apply_full_state(strategy, loaded.rest, _without_models(targets), strict)
        for load in loaded.engines:
            if load.weights is None:
                load.engine.load_checkpoint(str(load.folder), tag=load.tag, load_module_strict=strict,
                                            load_optimizer_states=load.optimizer is not None,
                                            load_lr_scheduler_states=True)
            else:
                names = strategy.optimizer_parameter_names(load.engine, load.optimizer) if load.optimizer else []
                load_full_state(load.engine, load.weights, load.optimizer_state, names, strict=strict)


def _dtype_name(engine) -> str:
    if engine.bfloat16_enabled():
        return "bfloat16"
    if engine.fp16_enabled():
        return "float16"
    return "float32"


def _check_rank_files(path: Path, layout: dict) -> None:
    """Every rank's partition file must be there before any engine starts loading."""
    if layout["zero_stage"] == 0:
        return
    missing = [f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in range(layout["world_size"])
               if not any(path.glob(f"*zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"))]  # bf16_... too
    if missing:
        raise IncompleteCheckpointError(f"DeepSpeed checkpoint {path} is incomplete: {', '.join(missing)} missing. "
                                        "Nothing was loaded; load another checkpoint.")
