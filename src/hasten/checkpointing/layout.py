"""The checkpoint folder's own names: what every format's folder holds besides its models and optimizers.

==============================  ==================================================================
``random_states_{rank}.pkl``    each process's random generators and the accumulation step (the reference's
                                name, so each library restores the other's)
``loader_states_{rank}.bin``    each process's prepared data loaders' positions (hasten's own: the reference's
                                ``dl_state_dict.bin`` is shared by all processes and only exists for stateful
                                loaders, so it cannot say where every process is)
``hasten_checkpoint.json``      marks a checkpoint as complete (``atomic.py``)
``hasten_checkpoint.process_{rank}.json``
                                the same, written by a process that saved a whole checkpoint into a folder other
                                than the main process's (each process given a folder of its own, as scripts under
                                Ray Train do): every name then belongs to one process or holds the same bytes in
                                every such folder, so the folders copied into one form one checkpoint
``hasten_process_{rank}.json``  the files a process added to a checkpoint the main process wrote by itself
                                (``contributions.py``)
==============================  ==================================================================

The models', optimizers', schedulers' and registered objects' files are named by the formats
(``full_files.py``, ``sharded_files.py``, ``deepspeed_files.py``; ``formats.py`` lists them). Automatic naming puts
checkpoints in ``{project_dir}/checkpoints/checkpoint_{iteration}``.
"""
from __future__ import annotations

import os
import re
from typing import Optional, Union

from ..core.constants import RNG_STATE_NAME

__all__ = [
    "RNG_STATE_NAME", "LOADER_STATES_NAME", "MARKER_NAME", "PROCESS_RECORD_NAME", "CHECKPOINTS_FOLDER", "NAME_PATTERN",
    "rng_file", "loader_states_file", "process_record_file", "process_files", "process_marker_file", "is_marker",
    "automatic_folder", "automatic_iteration",
]

LOADER_STATES_NAME = "loader_states"
MARKER_NAME = "hasten_checkpoint.json"
PROCESS_RECORD_NAME = "hasten_process"  # hasten_process_{rank}.json: the files a process added (contributions.py)
CHECKPOINTS_FOLDER = "checkpoints"
#: the names above, as found in a checkpoint folder
_PROCESS_MARKER = r"hasten_checkpoint\.process_\d+\.json"
NAME_PATTERN = (rf"{RNG_STATE_NAME}_\d+\.pkl|{LOADER_STATES_NAME}_\d+\.bin|{re.escape(MARKER_NAME)}"
                rf"|{PROCESS_RECORD_NAME}_\d+\.json|{_PROCESS_MARKER}")

_AUTOMATIC = re.compile(r"checkpoint_(\d+)")


def rng_file(process_index: int) -> str:
    return f"{RNG_STATE_NAME}_{process_index}.pkl"


def loader_states_file(process_index: int) -> str:
    return f"{LOADER_STATES_NAME}_{process_index}.bin"


def process_record_file(process_index: int) -> str:
    """The record of the files process ``process_index`` added to a checkpoint the main process wrote by itself."""
    return f"{PROCESS_RECORD_NAME}_{process_index}.json"


def process_files(process_index: int) -> tuple[str, ...]:
    """The names of the files process ``process_index`` writes for itself in a checkpoint folder."""
    return rng_file(process_index), loader_states_file(process_index), process_record_file(process_index)


def process_marker_file(process_index: int) -> str:
    """The completion marker of process ``process_index`` in a folder of its own (see the table above)."""
    return f"hasten_checkpoint.process_{process_index}.json"


def is_marker(relative: str) -> bool:
    """Whether ``relative`` names a completion marker, the main process's or one process's."""
    return relative == MARKER_NAME or re.fullmatch(_PROCESS_MARKER, relative) is not None


def automatic_folder(project_dir: Union[str, os.PathLike], iteration: int) -> str:
    """``{project_dir}/checkpoints/checkpoint_{iteration}``."""
    return os.path.join(os.fspath(project_dir), CHECKPOINTS_FOLDER, f"checkpoint_{iteration}")


def automatic_iteration(folder: Union[str, os.PathLike]) -> Optional[int]:
    """The iteration in an automatically named folder's name (``checkpoint_12`` -> 12), else None."""
    match = _AUTOMATIC.fullmatch(os.path.basename(os.path.normpath(os.fspath(folder))))
    return int(match.group(1)) if match else None
