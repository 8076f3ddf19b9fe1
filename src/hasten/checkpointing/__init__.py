"""Checkpointing, backend-neutral: ``save_state`` / ``load_state`` / ``save_model`` and automatic resume.

A strategy writes its state inside the staging folder through its checkpoint IO; everything around it is here,
one file per step:

- ``targets``: what a checkpoint saves and restores (``CheckpointTargets``, handed over by the Accelerator);
- ``strategy_protocol``: what checkpointing asks of the run's strategy (``CheckpointingStrategy``);
- the formats, one class each owning its names, how its files are found, read whole and recognised:
  ``full_files`` (``FullStateFormat``, the reference library's one file per object, so each library reads the
  other's), ``sharded_files`` (``ShardedFormat``, DCP folders), ``deepspeed_files`` (an engine's folder);
  ``formats`` lists them; ``layout``: the folder's own names (random states, loader positions, the marker);
- ``checkpoint_io``: the default IO, a strategy's state as full files: the snapshot taken before anything is
  written, and the files it becomes; ``full_state_reader``: any format read back whole, checked, then applied all
  or nothing;
- ``atomic`` / ``transaction``: staging folder, flush, completion marker, rename, one writer per folder; who
  writes what when several processes save; ``checksums``: each file's CRC in the marker, checked on load;
- ``saving`` / ``loading``: the two directions, given (strategy, targets, project configuration);
  ``agreement``: all processes succeed or all raise;
- ``async_save``: ``save_state(async_save=True)``, the files written in a background thread;
- ``rotation``: ``{project_dir}/checkpoints/checkpoint_{n}``, ``total_limit``, the newest complete one;
- file formats: ``writers`` (pickles and safetensors, durable), ``serialization`` (``save`` / ``load`` once per
  run), ``safe_load`` (``weights_only`` loading with an allow-list), ``safe_dcp`` (DCP folders read without
  running code), ``weights`` / ``save_model`` (weights in and out: wrapper prefixes, tied weights,
  sharded safetensors with an index), ``optimizer_names`` (optimizer states by name and by position), ``rng``
  (every process's random generators);
- ``auto_resume``: the one-liner that continues a restarted job;
- ``low_level_state``: Accelerate's low-level ``save_accelerator_state`` / ``load_accelerator_state`` /
  ``save_custom_state`` / ``load_custom_state``, over the same files.
"""
from .auto_resume import auto_resume, latest_checkpoint
from .errors import (CheckpointError, CheckpointNotFoundError, CheckpointWriteError, CorruptCheckpointError,
                     IncompleteCheckpointError, UnsafeCheckpointError)
from .loading import load_state
from .safe_load import SAFE_TYPES
from .save_model import save_model
from .saving import save_state
from .low_level_state import load_accelerator_state, load_custom_state, save_accelerator_state, save_custom_state

__all__ = [
    "auto_resume", "latest_checkpoint", "save_state", "load_state", "save_model",
    "CheckpointError", "CheckpointNotFoundError", "IncompleteCheckpointError", "CorruptCheckpointError",
    "UnsafeCheckpointError", "CheckpointWriteError", "SAFE_TYPES", "save_accelerator_state",
    "load_accelerator_state", "save_custom_state",
    "load_custom_state",
]
