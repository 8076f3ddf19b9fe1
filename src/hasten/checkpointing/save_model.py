"""``save_model``: a model's weights as files that big-model loading (``load_checkpoint_in_model``,
``load_checkpoint_and_dispatch``) and other libraries read.

Weights go in ``model.safetensors`` (or ``pytorch_model.bin``); a model larger than ``max_shard_size`` is
split, in state-dict order, into ``model-00001-of-0000N.safetensors`` ... with an index
``model.safetensors.index.json`` mapping every weight to its file (``{"metadata": {"total_size": bytes},
"weight_map": {name: file}}``), the layout the Hugging Face ecosystem uses. Tied weights are stored once.

Each file is written under a temporary name and renamed into place, the index last, so a reader never sees
a half-written shard; shards and indexes left by an earlier save that this one does not replace are
removed. Other files in the folder (a config, a tokenizer) are left alone.
"""
from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Union

import torch
from torch import nn

from ..collectives.process_view import ProcessView
from ..state import PartialState
from .agreement import together
from ..core.constants import MODEL_NAME, SAFE_MODEL_NAME
from .weights import drop_aliases
from .writers import atomic_file, write_pickle, write_tensors

if TYPE_CHECKING:
    from .strategy_protocol import CheckpointingStrategy

__all__ = ["save_model", "full_state_dict", "split_into_shards", "shard_names"]

logger = logging.getLogger(__name__)


def _size_in_bytes(max_shard_size: Union[int, str]) -> int:
    from ..big_modeling.sizes import convert_file_size_to_int

    size = convert_file_size_to_int(max_shard_size)
    if size <= 0:
        raise ValueError(f"max_shard_size must be positive, got {max_shard_size!r}.")
    return size


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def split_into_shards(tensors: dict, max_shard_size: int) -> list[list[str]]:
    """Names grouped into consecutive shards of at most ``max_shard_size`` bytes, in the dict's order.

    A tensor larger than the limit gets a shard of its own (it cannot be split).
    """
    shards: list[list[str]] = []
    current: list[str] = []
    current_size = 0
    for name, tensor in tensors.items():
        size = _nbytes(tensor)
        if current and current_size + size > max_shard_size:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
    if current or not shards:
        shards.append(current)
    return shards


def shard_names(count: int, safe_serialization: bool) -> list[str]:
    """``["model.safetensors"]`` for one shard, ``model-00001-of-00003.safetensors`` ... for several."""
    stem, extension = (SAFE_MODEL_NAME, "safetensors") if safe_serialization else (MODEL_NAME, "bin")
    if count == 1:
        return [f"{stem}.{extension}"]
    return [f"{stem}-{i:05d}-of-{count:05d}.{extension}" for i in range(1, count + 1)]


def _index_name(safe_serialization: bool) -> str:
    return f"{SAFE_MODEL_NAME}.safetensors.index.json" if safe_serialization else f"{MODEL_NAME}.bin.index.json"


def _stale_files(folder: Path, written: set, safe_serialization: bool) -> list[Path]:
    """Weight files of an earlier save of the same format that this save does not overwrite."""
    stem, extension = (SAFE_MODEL_NAME, "safetensors") if safe_serialization else (MODEL_NAME, "bin")
    index = re.escape(_index_name(safe_serialization))
    pattern = re.compile(rf"{re.escape(stem)}(-\d{{5}}-of-\d{{5}})?\.{extension}|{index}")
    return [folder / name for name in os.listdir(folder)
            if pattern.fullmatch(name) and name not in written and (folder / name).is_file()]


def _owned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """``torch.save`` writes a tensor's whole storage: give views of larger storages their own copy."""
    storage = tensor.untyped_storage()
    if tensor.is_contiguous() and tensor.storage_offset() == 0 and storage.nbytes() == _nbytes(tensor):
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def full_state_dict(strategy: CheckpointingStrategy, model: nn.Module) -> dict:
    """The model's whole state dict, as the strategy gathers it; for a model dispatched with CPU or disk
    offload (weights on meta, hooks holding the real ones), the real weights, brought in module by module."""
    from ..big_modeling.offloaded_state import get_state_dict_offloaded_model, has_offloaded_params

    unwrapped = strategy.unwrap(model)
    if any(has_offloaded_params(module) for module in unwrapped.modules()):
        return get_state_dict_offloaded_model(unwrapped)
    return strategy.model_state_dict(model, full=True)


def _check_state(state: dict) -> None:
    on_meta = [name for name, value in state.items() if isinstance(value, torch.Tensor) and value.device.type == "meta"]
    if on_meta:
        raise ValueError(
            f"Cannot save the model: {len(on_meta)} weight(s) are on the meta device and hold no data "
            f"({', '.join(on_meta[:5])}). Load the weights (or dispatch the model) before saving it."
        )
    not_tensors = [name for name, value in state.items() if not isinstance(value, torch.Tensor)]
    if not_tensors:
        raise TypeError(f"The model's state dict holds values that are not tensors: {not_tensors[:5]}.")


def _write(folder: Path, state: dict, max_shard_size: int, safe_serialization: bool) -> list[str]:
    kept, aliases = drop_aliases(state)
    shards = split_into_shards(kept, max_shard_size)
    names = shard_names(len(shards), safe_serialization)
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for file_name, members in zip(names, shards):
        for name in members:
            weight_map[name] = file_name
        if safe_serialization:
            with atomic_file(folder / file_name) as temporary:
                write_tensors({name: kept[name] for name in members}, temporary, metadata={"format": "pt"})
        else:
            copies = {name: _owned_copy(kept[name]) for name in members}
            # pickle keeps sharing: tied names point at their twin's copy and cost nothing
            copies.update({alias: copies[target] for alias, target in aliases.items() if target in copies})
            for alias, target in aliases.items():
                if target in copies:
                    weight_map[alias] = file_name
            with atomic_file(folder / file_name) as temporary:
                write_pickle(copies, temporary)
    written = set(names)
    if len(names) > 1:
        index = {"metadata": {"total_size": sum(_nbytes(t) for t in kept.values())},
                 "weight_map": dict(sorted(weight_map.items()))}
        index_name = _index_name(safe_serialization)
        with atomic_file(folder / index_name) as temporary:
            temporary.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.add(index_name)
        logger.info("Model saved in %d shards of at most %d bytes; index in %s.", len(names), max_shard_size,
                    folder / index_name)
    for stale in _stale_files(folder, written, safe_serialization):
        stale.unlink()
    return names


def save_model(strategy: CheckpointingStrategy, model: nn.Module, save_directory: Union[str, os.PathLike],
               max_shard_size: Union[int, str] = "10GB", safe_serialization: bool = True,
               save_on_each_node: bool = False) -> list[str]:
    """Save ``model``'s weights to ``save_directory`` (see the module docstring); returns the weight files'
    names. The main process writes (each machine's main process with ``save_on_each_node``). Where the strategy
    holds the whole model on every process (``Strategy.saves_from_one_process``: one process, DDP) nothing waits for
    the other processes, so a call made on the main process only (``if accelerator.is_main_process:``) works, as in
    the reference; a sharded model is gathered from every process, so every process calls it, and a failure on one
    is raised on all."""
    folder = Path(os.fspath(save_directory))
    if folder.is_file():
        raise ValueError(f"save_directory {folder} is a file; save_model writes a folder. Choose a folder path.")
    limit = _size_in_bytes(max_shard_size)
    state = full_state_dict(strategy, model)
    _check_state(state)
    partial = PartialState()
    writer = partial.is_local_main_process if save_on_each_node else partial.is_main_process
    processes = None if not getattr(strategy, "saves_from_one_process", True) else ProcessView.alone(partial)
    return together("save_model", lambda: _write(folder, state, limit, safe_serialization) if writer
                    else shard_names(len(split_into_shards(drop_aliases(state)[0], limit)), safe_serialization),
                    processes=processes)
