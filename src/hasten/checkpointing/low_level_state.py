"""Accelerate's low-level checkpoint functions: ``save_accelerator_state`` / ``load_accelerator_state`` and
``save_custom_state`` / ``load_custom_state``, for code that calls them directly.

They write and read the same files as ``Accelerator.save_state`` / ``load_state`` (names from the formats, ``full_files.py``, and ``layout``,
weights through ``weights``, random generators through ``rng``, pickles read safely through
``safe_load``), but into the folder given, file by file: each file is replaced atomically, the folder as a
whole is not (no staging folder, no completion marker). Use ``Accelerator.save_state`` for that.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from ..state import PartialState
from . import layout
from .full_files import FullStateFormat
from .full_state_reader import model_location
from .weights import drop_aliases, fill_aliases, match_keys
from .rng import capture_rng_states, restore_rng_states
from .safe_load import load_pickle_file
from .serialization import save as _save_from_one_process
from .targets import loader_state
from .writers import atomic_file, write_pickle, write_tensors

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed.checkpoint.stateful import Stateful
    from torch.utils.data import DataLoader

__all__ = ["save_accelerator_state", "load_accelerator_state", "save_custom_state", "load_custom_state"]

logger = logging.getLogger(__name__)

_MAP_LOCATIONS = (None, "cpu", "on_device")


def _pickle(obj, path: Path) -> None:
    with atomic_file(path) as temporary:
        write_pickle(obj, temporary)


def _writes_shared_files(save_on_each_node: bool) -> bool:
    state = PartialState()
    return state.is_local_main_process if save_on_each_node else state.is_main_process


def save_accelerator_state(output_dir: Union[str, os.PathLike], model_states: list[dict],
                           optimizers: list[torch.optim.Optimizer], schedulers: list[Stateful],
                           dataloaders: list[DataLoader], process_index: int, step: int,
                           scaler: Optional[torch.amp.GradScaler] = None, save_on_each_node: bool = False,
                           safe_serialization: bool = True) -> Path:
    """Write model state dicts, optimizer / scheduler / scaler states, data loader positions and random
    generators into ``output_dir`` (created if needed); returns it as a ``Path``.

    Shared files are written by the main process (by each machine's with ``save_on_each_node``); the random
    states (with ``step``) and loader positions are per process, in ``random_states_{process_index}.pkl`` and
    ``loader_states_{process_index}.bin``. Model weights go to ``model.safetensors`` (tied weights stored once)
    or, without ``safe_serialization``, ``pytorch_model.bin``; the second model's to ``model_1...`` and so on.
    """
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    if _writes_shared_files(save_on_each_node):
        for index, weights in enumerate(model_states):
            path = folder / FullStateFormat.model_file(index, safe_serialization)
            if safe_serialization:
                with atomic_file(path) as temporary:
                    write_tensors(drop_aliases(weights)[0], temporary, metadata={"format": "pt"})
            else:
                _pickle(dict(weights), path)
            logger.info("Model weights saved in %s", path)
        for index, optimizer in enumerate(optimizers):
            _pickle(optimizer.state_dict(), folder / FullStateFormat.optimizer_file(index))
        for index, scheduler in enumerate(schedulers):
            _pickle(scheduler.state_dict(), folder / FullStateFormat.scheduler_file(index))
        if scaler is not None:
            _pickle(scaler.state_dict(), folder / FullStateFormat.SCALER_NAME)
    if dataloaders:
        positions = [loader_state(loader) for loader in dataloaders]
        _pickle(positions, folder / layout.loader_states_file(process_index))
    _pickle(capture_rng_states(step=step), folder / layout.rng_file(process_index))
    logger.info("State saved in %s", folder)
    return folder


def load_accelerator_state(input_dir: Union[str, os.PathLike], models: list[nn.Module],
                           optimizers: list[torch.optim.Optimizer], schedulers: list[Stateful],
                           dataloaders: list[DataLoader], process_index: int,
                           scaler: Optional[torch.amp.GradScaler] = None, map_location: Optional[str] = None,
                           load_kwargs: Optional[dict] = None, **load_model_func_kwargs: Any) -> dict[str, int]:
    """Load what ``save_accelerator_state`` (or ``Accelerator.save_state``, or the reference) wrote into the
    objects given; returns ``{"step": ...}``, the saved step, when the random states held one.

    ``map_location`` places the model and optimizer states: ``None`` / ``"cpu"`` or ``"on_device"`` (the
    process's device). ``load_kwargs`` go to ``torch.load``: pickles are read with ``weights_only=True`` unless
    it says otherwise. ``load_model_func_kwargs`` (e.g. ``strict=False``) go to each ``model.load_state_dict``.
    A missing or damaged file raises an error naming it.
    """
    if map_location not in _MAP_LOCATIONS:
        raise ValueError(f"map_location must be one of {_MAP_LOCATIONS}, got {map_location!r}.")
    device = PartialState().device if map_location == "on_device" else "cpu"
    folder = Path(input_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"Cannot load the state from {folder}: the folder does not exist.")
    overrides = {}

    for index, model in enumerate(models):
        fmt, path = model_location(folder, index)  # model.safetensors, else pytorch_model.bin, else another format's
        loaded = fmt.read_weights(path, f"weights of model {index}", device=device, load_kwargs=load_kwargs)
        expected = model.state_dict(keep_vars=True)
        model.load_state_dict(fill_aliases(match_keys(loaded, expected.keys()), expected), **load_model_func_kwargs)
    for index, optimizer in enumerate(optimizers):
        path = folder / FullStateFormat.optimizer_file(index)
        optimizer.load_state_dict(load_pickle_file(path, f"optimizer {index}", map_location=device,
                                                   load_kwargs=load_kwargs))
    for index, scheduler in enumerate(schedulers):
        path = folder / FullStateFormat.scheduler_file(index)
        scheduler.load_state_dict(load_pickle_file(path, f"scheduler {index}", load_kwargs=load_kwargs))
    if scaler is not None:
        scaler.load_state_dict(load_pickle_file(folder / FullStateFormat.SCALER_NAME, "the gradient scaler",
                                                load_kwargs=load_kwargs))
    if dataloaders:
        path = folder / layout.loader_states_file(process_index)
        if path.is_file():
            positions = load_pickle_file(path, "data loader positions", load_kwargs=load_kwargs)
            for loader, position in zip(dataloaders, positions):
                if position is not None and callable(getattr(loader, "load_state_dict", None)):
                    loader.load_state_dict(position)
        else:
            logger.warning("%s has no %s: the data loaders start from the beginning.", folder, path.name)

    rng_path = folder / layout.rng_file(process_index)
    if rng_path.is_file():
        states = load_pickle_file(rng_path, f"random states of process {process_index}", load_kwargs=load_kwargs)
        restore_rng_states(states, source=str(rng_path))
        if "step" in states:
            overrides["step"] = int(states["step"])
    else:
        logger.warning("%s has no %s: the random generators keep their current state.", folder, rng_path.name)
    return overrides


def save_custom_state(obj: Stateful, path: Union[str, os.PathLike], index: int = 0,
                      save_on_each_node: bool = False) -> None:
    """Save ``obj.state_dict()`` to ``{path}/custom_checkpoint_{index}.pkl`` (from the main process, atomically)."""
    location = Path(path) / FullStateFormat.custom_object_file(index)
    logger.info("Saving the state of %s to %s", type(obj).__qualname__, location)
    _save_from_one_process(obj.state_dict(), location, save_on_each_node=save_on_each_node)


def load_custom_state(obj: Stateful, path: Union[str, os.PathLike], index: int = 0,
                      load_kwargs: Optional[dict] = None) -> None:
    """Load ``{path}/custom_checkpoint_{index}.pkl`` into ``obj.load_state_dict``.

    Read with ``weights_only=True`` (the reference always unpickles freely, which runs whatever code the file
    holds): a state holding other objects raises ``UnsafeCheckpointError``, which says how to allow them, e.g.
    ``load_kwargs={"weights_only": False}`` for a file you trust.
    """
    location = Path(path) / FullStateFormat.custom_object_file(index)
    logger.info("Loading the state of %s from %s", type(obj).__qualname__, location)
    obj.load_state_dict(load_pickle_file(location, f"registered object {index}", map_location="cpu",
                                         load_kwargs=load_kwargs))
