"""``TrackioTracker`` (``log_with="trackio"``): trackio runs, stored locally (a wandb-like API, no account)."""
from __future__ import annotations

from typing import Any

from ..core import imports
from .base import on_main_process
from .run_tracker import RunTracker
from .values import prepare_config

__all__ = ["TrackioTracker"]


class TrackioTracker(RunTracker):
    """A trackio run for project ``run_name``; keyword arguments go to ``trackio.init`` (``name``, ``space_id`` ...).

    Main process only, like every built-in tracker in hasten (see ``WandBTracker``).
    """

    name = "trackio"
    is_installed = staticmethod(imports.is_trackio_available)
    package = "trackio"

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._module().config.update(prepare_config(values), allow_val_change=True)
