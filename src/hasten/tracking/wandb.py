"""``WandBTracker`` (``log_with="wandb"``): Weights & Biases runs (``mode="offline"`` in init_kwargs works without
an account; ``wandb sync`` uploads later).

With a logging directory and no ``dir`` in init_kwargs, wandb writes under ``<logging_dir>/wandb``.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from ..core import imports
from .base import on_main_process
from .run_tracker import RunTracker
from .values import prepare_config

__all__ = ["WandBTracker"]


class WandBTracker(RunTracker):
    """A wandb run for project ``run_name``; keyword arguments go to ``wandb.init`` (``mode``, ``dir``, ``tags`` ...).

    Runs on the main process only (Accelerate marks it ``main_process_only = False``, but its Accelerator only calls
    trackers on the main process; hasten says so here, so a 2-process run makes one wandb run, not two).
    """

    name = "wandb"
    is_installed = staticmethod(imports.is_wandb_available)
    package = "wandb"

    def _use_logging_dir(self, logging_dir: str) -> None:
        """Write under ``logging_dir`` unless init_kwargs name a ``dir``."""
        self.init_kwargs.setdefault("dir", logging_dir)

    @on_main_process
    def start(self) -> None:
        if self.init_kwargs.get("dir"):
            os.makedirs(self.init_kwargs["dir"], exist_ok=True)
        super().start()

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(prepare_config(values), allow_val_change=True)

    @on_main_process
    def log_table(self, table_name: str, columns: Optional[list[str]] = None, data: Optional[list[list[Any]]] = None,
                  dataframe: Any = None, step: Optional[int] = None, **kwargs: Any) -> None:
        """Log a ``wandb.Table`` from ``columns`` + ``data`` rows, or from a ``dataframe``."""
        table = self._module().Table(columns=columns, data=data, dataframe=dataframe)
        self.run.log({table_name: table}, step=step, **kwargs)
