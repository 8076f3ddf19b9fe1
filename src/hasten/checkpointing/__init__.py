"""Checkpointing: ``save_state`` / ``load_state`` / ``save_model`` and automatic resume.

One file per job:

- ``layout``: the checkpoint folder's file names (the reference library's, so each library reads the other's);
- ``snapshot``: every state a checkpoint holds, taken from the Accelerator (model and optimizer states
  from the strategy);
- ``atomic`` / ``transaction``: staging folder, flush, completion marker, rename; who writes what when
  several processes save; ``checksums``: each file's CRC in the marker, checked on load; ``lock``: one
  writer per folder;
- ``saving`` / ``loading``: the two directions; ``agreement``: all processes succeed or all raise;
- ``async_save``: ``save_state(async_save=True)``, the files written in a background thread;
- ``rotation``: ``{project_dir}/checkpoints/checkpoint_{n}``, ``total_limit``, the newest complete one;
- ``rng``: every process's random generators; ``safe_load``: ``weights_only`` loading with an allow-list;
- ``model_files`` / ``safetensors_io`` / ``save_model``: weights in and out (wrapper prefixes, tied weights,
  sharded safetensors with an index);
- ``auto_resume``: the one-liner that continues a restarted job;
- ``state_files``: Accelerate's low-level ``save_accelerator_state`` / ``load_accelerator_state`` /
  ``save_custom_state`` / ``load_custom_state``, over the same files.
"""
from .auto_resume import auto_resume, latest_checkpoint
from .errors import (CheckpointError, CheckpointNotFoundError, CheckpointWriteError, CorruptCheckpointError,
                     IncompleteCheckpointError, UnsafeCheckpointError)
from .loading import load_state
from .safe_load import SAFE_TYPES
from .save_model import save_model
from .saving import save_state
from .state_files import load_accelerator_state, load_custom_state, save_accelerator_state, save_custom_state

__all__ = [
    "auto_resume", "latest_checkpoint", "save_state", "load_state", "save_model",
    "CheckpointError", "CheckpointNotFoundError", "IncompleteCheckpointError", "CorruptCheckpointError",
    "UnsafeCheckpointError", "CheckpointWriteError", "SAFE_TYPES", "save_accelerator_state",
    "load_accelerator_state", "save_custom_state",
    "load_custom_state",
]
