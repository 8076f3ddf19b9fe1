"""Every checkpoint format hasten reads, in one table, and the folder scan built from their names.

A format is one class that owns its names, how its files are found in a checkpoint folder and read whole, and
how it recognises itself (the ``CheckpointFormat`` protocol): ``FullStateFormat`` (``full_files.py``, the
reference library's one file per object), ``ShardedFormat`` (``sharded_files.py``, DCP folders per rank) and
``DeepSpeedCheckpointFormat`` (``deepspeed_files.py``, an engine's own folder). The neutral rooms ask this table
and name none of them: the full-state reader finds each model's and optimizer's files through ``READ_WHOLE``, the
transaction's folder scan is ``is_checkpoint_file``. A new format is a class beside these and a line in the table.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from . import layout
from .deepspeed_files import DeepSpeedCheckpointFormat
from .full_files import FullStateFormat
from .sharded_files import ShardedFormat

__all__ = ["CheckpointFormat", "READ_WHOLE", "is_checkpoint_file", "locate"]


class CheckpointFormat(Protocol):
    """One way a checkpoint folder holds models and optimizers."""

    #: a regular expression matching every name the format adds to a checkpoint folder
    NAME_PATTERN: str

    def model_location(self, folder: Path, index: int) -> Optional[Path]:
        """Where model ``index``'s weights are in ``folder`` in this format, or None."""

    def optimizer_location(self, folder: Path, index: int) -> Optional[Path]:
        """Where optimizer ``index``'s state is in ``folder`` in this format, or None."""

    def check_trusted(self, checkpoint: Path, marker: Optional[dict], load_kwargs: Optional[dict]) -> None:
        """Raise before anything is read when the files may not be unpickled."""

    def read_weights(self, path: Path, what: str, *, device: Any = "cpu", load_kwargs: Optional[dict] = None) -> Any:
        """The model's full state dict."""

    def read_optimizer(self, path: Path, what: str, names: Callable[[], list], *, device: Any = "cpu",
                       load_kwargs: Optional[dict] = None) -> Any:
        """The optimizer's full state by position (``names()``: the prepared optimizer's parameter names)."""


#: the formats the full-state reader reads whole, in the order a folder is searched
READ_WHOLE: tuple = (FullStateFormat(), ShardedFormat(), DeepSpeedCheckpointFormat())

_CHECKPOINT_NAME = re.compile("|".join(f"(?:{pattern})" for pattern in
                                       (layout.NAME_PATTERN, *(fmt.NAME_PATTERN for fmt in READ_WHOLE))))


def is_checkpoint_file(name: str) -> bool:
    """Whether ``name`` is a file or folder name a saved state uses (written by hasten or the reference library)."""
    return _CHECKPOINT_NAME.fullmatch(name) is not None


def locate(folder: Path, index: int, kind: str) -> Optional[tuple]:
    """``(format, path)`` of the first format holding ``kind`` (``"model"`` or ``"optimizer"``) ``index`` in
    ``folder``, or None."""
    for fmt in READ_WHOLE:
        path = fmt.model_location(folder, index) if kind == "model" else fmt.optimizer_location(folder, index)
        if path is not None:
            return fmt, path
    return None
