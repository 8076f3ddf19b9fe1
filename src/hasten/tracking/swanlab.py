"""``SwanLabTracker`` (``log_with="swanlab"``): SwanLab runs (``mode="local"`` or ``"offline"`` in init_kwargs keep
them on disk). With a logging directory and no ``log_dir`` in init_kwargs, files go to ``<logging_dir>/swanlog``."""
from __future__ import annotations

import os
from typing import Optional

from .base import GeneralTracker, on_main_process
from .packages import import_tracker_package
from .values import prepare_config, prepare_log_values

__all__ = ["SwanLabTracker"]


class SwanLabTracker(GeneralTracker):
    """A SwanLab run for project ``run_name``; keyword arguments go to ``swanlab.init``.

    Main process only, like every built-in tracker in hasten (see ``WandBTracker``).
    """

    name = "swanlab"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs):
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run = None

    def _use_logging_dir(self, logging_dir: str) -> None:
        if "log_dir" not in self.init_kwargs and "logdir" not in self.init_kwargs:
            self.init_kwargs["log_dir"] = os.path.join(logging_dir, "swanlog")

    @on_main_process
    def start(self):
        swanlab = import_tracker_package("swanlab", self.name)
        self.run = swanlab.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self):
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict):
        import_tracker_package("swanlab", self.name).config.update(prepare_config(values))

    @on_main_process
    def log(self, values: dict, step: Optional[int] = None, **kwargs):
        """Numbers are logged as scalars, strings as ``swanlab.Text``."""
        swanlab = import_tracker_package("swanlab", self.name)
        values = {key: swanlab.Text(value) if isinstance(value, str) else value
                  for key, value in prepare_log_values(values).items()}
        self.run.log(values, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict, step: Optional[int] = None, **kwargs):
        """Log ``{name: list of images}``."""
        swanlab = import_tracker_package("swanlab", self.name)
        self.run.log({key: [swanlab.Image(image) for image in images] for key, images in values.items()}, step=step,
                     **kwargs)

    @on_main_process
    def finish(self):
        if self.run is not None:
            self.run.finish()
