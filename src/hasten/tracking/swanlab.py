"""``SwanLabTracker`` (``log_with="swanlab"``): SwanLab runs (``mode="local"`` or ``"offline"`` in init_kwargs keep
them on disk). With a logging directory and no ``log_dir`` in init_kwargs, files go to ``<logging_dir>/swanlog``."""
from __future__ import annotations

import os
from typing import Any

from ..core import imports
from .base import on_main_process
from .run_tracker import RunTracker
from .values import prepare_config, prepare_log_values

__all__ = ["SwanLabTracker"]


class SwanLabTracker(RunTracker):
    """A SwanLab run for project ``run_name``; keyword arguments go to ``swanlab.init``.

    Main process only, like every built-in tracker in hasten (see ``WandBTracker``).
    """

    name = "swanlab"
    is_installed = staticmethod(imports.is_swanlab_available)
    package = "swanlab"

    def _use_logging_dir(self, logging_dir: str) -> None:
        if "log_dir" not in self.init_kwargs and "logdir" not in self.init_kwargs:
            self.init_kwargs["log_dir"] = os.path.join(logging_dir, "swanlog")

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._module().config.update(prepare_config(values))

    def _loggable(self, values: dict) -> dict:
        """Numbers are logged as scalars, strings as ``swanlab.Text`` (SwanLab refuses plain strings)."""
        text = self._module().Text
        return {key: text(value) if isinstance(value, str) else value
                for key, value in prepare_log_values(values).items()}
