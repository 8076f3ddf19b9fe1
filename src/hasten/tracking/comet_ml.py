"""``CometMLTracker`` (``log_with="comet_ml"``): Comet experiments (``mode="offline"`` in init_kwargs writes a zip
archive locally, uploaded later with ``comet upload``).

With a logging directory and no ``experiment_config`` in init_kwargs, offline archives go to the logging directory.
"""
from __future__ import annotations

from typing import Any, Optional

from ..core import imports
from .base import GeneralTracker, on_main_process
from .packages import import_tracker_package
from .values import prepare_config, prepare_log_values

__all__ = ["CometMLTracker"]


class CometMLTracker(GeneralTracker):
    """A Comet experiment in project ``run_name``; keyword arguments go to ``comet_ml.start``."""

    name = "comet_ml"
    package = "comet_ml"
    is_installed = staticmethod(imports.is_comet_ml_available)
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any):
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.writer = None

    def _use_logging_dir(self, logging_dir: str) -> None:
        """Put offline archives in ``logging_dir`` unless init_kwargs already configure the experiment."""
        if "experiment_config" not in self.init_kwargs:
            comet_ml = import_tracker_package("comet_ml", self.name)
            self.init_kwargs["experiment_config"] = comet_ml.ExperimentConfig(offline_directory=logging_dir)

    @on_main_process
    def start(self) -> None:
        comet_ml = import_tracker_package("comet_ml", self.name)
        self.writer = comet_ml.start(project_name=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.log_parameters(prepare_config(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        if step is not None:
            self.writer.set_step(step)
        for key, value in prepare_log_values(values).items():
            if isinstance(value, str):
                self.writer.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics(value, prefix=key, step=step, **kwargs)
            else:
                self.writer.log_metric(key, value, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        if self.writer is not None:
            self.writer.end()
