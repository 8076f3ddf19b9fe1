"""``ProjectConfiguration``: where a run writes its checkpoints and logs, and how checkpoints are named."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from .booleans import normalize_bool_fields

__all__ = ["ProjectConfiguration"]


@dataclass
class ProjectConfiguration:
    """Folders and checkpoint naming of a run.

    project_dir: the run's folder. logging_dir: trackers' folder (defaults to project_dir).
    automatic_checkpoint_naming: save states to ``{project_dir}/checkpoints/checkpoint_{iteration}``.
    total_limit: keep at most this many automatically named checkpoints (oldest removed first).
    iteration: the number of the next automatic checkpoint.
    save_on_each_node: in multi-machine runs write on every machine, not only the main one.
    """

    project_dir: Optional[str] = None
    logging_dir: Optional[str] = None
    automatic_checkpoint_naming: bool = False
    total_limit: Optional[int] = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self):
        normalize_bool_fields(self)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and (not isinstance(self.total_limit, int) or self.total_limit < 1):
            raise ValueError(f"total_limit must be None or an int >= 1, got {self.total_limit!r}.")
        if not isinstance(self.iteration, int) or self.iteration < 0:
            raise ValueError(f"iteration must be an int >= 0, got {self.iteration!r}.")

    def set_directories(self, project_dir: Optional[str] = None) -> None:
        """Set ``project_dir`` (and ``logging_dir`` when it was not given separately)."""
        self.project_dir = os.fspath(project_dir) if project_dir is not None else None
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
