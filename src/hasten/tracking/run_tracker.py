"""``RunTracker``: the shape shared by trackers whose library makes one run object with
``<package>.init(project=run_name, **init_kwargs)`` and logs through ``run.log(values, step=...)`` (W&B, Trackio,
SwanLab). Each subclass names its package and adds what is its own (where files go, config, images, tables)."""
from __future__ import annotations

from typing import Any, Optional

from .base import GeneralTracker, on_main_process
from .packages import import_tracker_package
from .values import prepare_log_values

__all__ = ["RunTracker"]


class RunTracker(GeneralTracker):
    """One run of ``package`` for project ``run_name``; keyword arguments go to ``<package>.init``."""

    package: str  # the module imported (lazily) to make the run
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any):
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run = None

    def _module(self):
        return import_tracker_package(self.package, self.name)

    @on_main_process
    def start(self) -> None:
        self.run = self._module().init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def _loggable(self, values: dict) -> dict:
        """``values`` as the library takes them (checked numbers and strings; a subclass may wrap strings)."""
        return prepare_log_values(values)

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        self.run.log(self._loggable(values), step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log ``{name: list of images}`` (numpy arrays or PIL images) as the library's ``Image``."""
        image = self._module().Image
        self.run.log({key: [image(item) for item in images] for key, images in values.items()}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
