"""``AimTracker`` (``log_with="aim"``): an Aim run in the Aim repository at the logging directory (created if new)."""
from __future__ import annotations

import os
from typing import Any, Optional, Union

from ..core import imports
from .base import GeneralTracker, on_main_process
from .packages import import_tracker_package
from .values import prepare_config, prepare_log_values

__all__ = ["AimTracker"]


class AimTracker(GeneralTracker):
    """An Aim run named ``run_name`` in the repository at ``logging_dir``; keyword arguments go to ``aim.Run``."""

    name = "aim"
    package = "aim"
    is_installed = staticmethod(imports.is_aim_available)
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: Optional[Union[str, os.PathLike]] = ".", **kwargs: Any):
        super().__init__()
        self.run_name = run_name
        self.aim_repo_path = os.fspath(logging_dir)
        self.init_kwargs = kwargs
        self.writer = None

    @on_main_process
    def start(self) -> None:
        aim = import_tracker_package("aim", self.name)
        os.makedirs(self.aim_repo_path, exist_ok=True)
        self.writer = aim.Run(repo=self.aim_repo_path, **self.init_kwargs)
        self.writer.name = self.run_name

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer["hparams"] = prepare_config(values)

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Numbers are tracked as metrics, strings as ``aim.Text``."""
        aim = import_tracker_package("aim", self.name)
        for key, value in prepare_log_values(values).items():
            self.writer.track(aim.Text(value) if isinstance(value, str) else value, name=key, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: Optional[int] = None,
                   kwargs: Optional[dict[str, dict]] = None) -> None:
        """Log ``{name: image or (image, caption)}``; ``kwargs`` may hold ``aim_image`` and ``track`` keyword dicts."""
        aim = import_tracker_package("aim", self.name)
        kwargs = kwargs or {}
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            self.writer.track(aim.Image(image, caption=caption, **kwargs.get("aim_image", {})), name=key, step=step,
                              **kwargs.get("track", {}))

    @on_main_process
    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()
