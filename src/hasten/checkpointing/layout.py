"""Where each piece of a saved state goes: the checkpoint folder's file names.

The names are the reference library's (Accelerate), so one library can read a folder the other wrote:

=============================  ===================================================================
``model.safetensors``          first model (``model_1.safetensors`` ... for the others);
                               ``pytorch_model.bin`` / ``pytorch_model_1.bin`` with pickle
``optimizer.bin``              first optimizer (``optimizer_1.bin`` ...)
``scheduler.bin``              first scheduler (``scheduler_1.bin`` ...)
``scaler.pt``                  the fp16 ``GradScaler``
``random_states_{rank}.pkl``   each process's random generators and the accumulation step
``custom_checkpoint_{i}.pkl``  objects given to ``register_for_checkpointing``
=============================  ===================================================================

Two files are hasten's own (the reference ignores them): ``loader_states_{rank}.bin`` holds each process's
prepared data loaders' positions (the reference's ``dl_state_dict.bin`` is shared by all processes and only
exists for stateful loaders, so it cannot say where every process is), and ``hasten_checkpoint.json``
marks a checkpoint as complete (see ``atomic.py``). ``hasten_process_{rank}.json`` lists the files a process added to
a checkpoint the main process wrote by itself (``contributions.py``).
"""
from __future__ import annotations

import os
import re
from typing import Optional

# model.safetensors / pytorch_model.bin, optimizer.bin ...: Accelerate's names, defined in hasten.utils.constants
from ..core.constants import MODEL_NAME, OPTIMIZER_NAME, RNG_STATE_NAME, SAFE_MODEL_NAME, SCALER_NAME, SCHEDULER_NAME
from .sharded_files import ShardedFormat

__all__ = [
    "SAFE_MODEL_NAME", "MODEL_NAME", "OPTIMIZER_NAME", "SCHEDULER_NAME", "SCALER_NAME", "RNG_STATE_NAME",
    "CUSTOM_NAME", "LOADER_STATES_NAME", "REFERENCE_LOADER_NAMES", "MARKER_NAME", "CHECKPOINTS_FOLDER",
    "model_file", "optimizer_file", "scheduler_file", "custom_object_file", "rng_file", "loader_states_file",
    "process_record_file", "PROCESS_RECORD_NAME",
    "automatic_folder", "automatic_iteration", "is_custom_object_file", "is_checkpoint_file",
]

CUSTOM_NAME = "custom_checkpoint"
LOADER_STATES_NAME = "loader_states"
# What the reference writes for data loaders (a pickled sampler, a stateful loader's shared state).
REFERENCE_LOADER_NAMES = ("sampler", "dl_state_dict")
MARKER_NAME = "hasten_checkpoint.json"
PROCESS_RECORD_NAME = "hasten_process"  # hasten_process_{rank}.json: the files a process added (contributions.py)
CHECKPOINTS_FOLDER = "checkpoints"

_AUTOMATIC = re.compile(r"checkpoint_(\d+)")
_CUSTOM = re.compile(rf"{CUSTOM_NAME}_(\d+)\.pkl")
# Every file name either library writes into a checkpoint folder.
_CHECKPOINT_FILE = re.compile(
    r"(model|pytorch_model|optimizer|scheduler|sampler|dl_state_dict)(_\d+)?\.(safetensors|bin)"
    rf"|{re.escape(SCALER_NAME)}|{RNG_STATE_NAME}_\d+\.pkl|{CUSTOM_NAME}_\d+\.pkl|{LOADER_STATES_NAME}_\d+\.bin"
    rf"|{re.escape(MARKER_NAME)}|{PROCESS_RECORD_NAME}_\d+\.json"
    rf"|{ShardedFormat.NAME_PATTERN}"  # sharded (DCP) folders of models and optimizers
)


def _numbered(stem: str, index: int, extension: str) -> str:
    """``stem.ext`` for the first object, ``stem_{index}.ext`` for the others (the reference's rule)."""
    return f"{stem}.{extension}" if index == 0 else f"{stem}_{index}.{extension}"


def model_file(index: int, safe_serialization: bool = True) -> str:
    return _numbered(SAFE_MODEL_NAME, index, "safetensors") if safe_serialization \
        else _numbered(MODEL_NAME, index, "bin")


def optimizer_file(index: int) -> str:
    return _numbered(OPTIMIZER_NAME, index, "bin")


def scheduler_file(index: int) -> str:
    return _numbered(SCHEDULER_NAME, index, "bin")


def custom_object_file(index: int) -> str:
    return f"{CUSTOM_NAME}_{index}.pkl"


def is_custom_object_file(name: str) -> bool:
    return _CUSTOM.fullmatch(name) is not None


def rng_file(process_index: int) -> str:
    return f"{RNG_STATE_NAME}_{process_index}.pkl"


def loader_states_file(process_index: int) -> str:
    return f"{LOADER_STATES_NAME}_{process_index}.bin"


def process_record_file(process_index: int) -> str:
    """The record of the files process ``process_index`` added to a checkpoint the main process wrote by itself."""
    return f"{PROCESS_RECORD_NAME}_{process_index}.json"


def automatic_folder(project_dir, iteration: int) -> str:
    """``{project_dir}/checkpoints/checkpoint_{iteration}``."""
    return os.path.join(os.fspath(project_dir), CHECKPOINTS_FOLDER, f"checkpoint_{iteration}")


def automatic_iteration(folder) -> Optional[int]:
    """The iteration in an automatically named folder's name (``checkpoint_12`` -> 12), else None."""
    match = _AUTOMATIC.fullmatch(os.path.basename(os.path.normpath(os.fspath(folder))))
    return int(match.group(1)) if match else None


def is_checkpoint_file(name: str) -> bool:
    """Whether ``name`` is a file name a saved state uses (written by hasten or by the reference library)."""
    return _CHECKPOINT_FILE.fullmatch(name) is not None
