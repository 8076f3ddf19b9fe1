"""``TrackioTracker`` (``log_with="trackio"``): trackio runs, stored locally (a wandb-like API, no account)."""
from __future__ import annotations

from typing import Optional

from .base import GeneralTracker, on_main_process
from .packages import import_tracker_package
from .values import prepare_config, prepare_log_values

__all__ = ["TrackioTracker"]


class TrackioTracker(GeneralTracker):
    """A trackio run for project ``run_name``; keyword arguments go to ``trackio.init`` (``name``, ``space_id`` ...).

    Main process only, like every built-in tracker in hasten (see ``WandBTracker``).
    """

    name = "trackio"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs):
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run = None

    @on_main_process
    def start(self):
        trackio = import_tracker_package("trackio", self.name)
        self.run = trackio.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self):
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict):
        trackio = import_tracker_package("trackio", self.name)
        trackio.config.update(prepare_config(values), allow_val_change=True)

    @on_main_process
    def log(self, values: dict, step: Optional[int] = None, **kwargs):
        self.run.log(prepare_log_values(values), step=step, **kwargs)

    @on_main_process
    def finish(self):
        if self.run is not None:
            self.run.finish()
