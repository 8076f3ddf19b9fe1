"""``DVCLiveTracker`` (``log_with="dvclive"``): metrics and params as DVCLive files (plain TSV/JSON/YAML, local).

With a logging directory and no ``dir`` in init_kwargs, files go to ``<logging_dir>/dvclive`` (``dvc.yaml``
included, instead of the working directory).
"""
from __future__ import annotations

import os
from typing import Any, Optional

from ..core import imports
from .base import GeneralTracker, on_main_process
from .packages import import_tracker_package
from .values import prepare_config, prepare_log_values

__all__ = ["DVCLiveTracker"]


class DVCLiveTracker(GeneralTracker):
    """Log through ``live`` (a ``dvclive.Live``) or a new ``Live(**kwargs)``; each ``log`` call is one step."""

    name = "dvclive"
    package = "dvclive"
    is_installed = staticmethod(imports.is_dvclive_available)
    requires_logging_directory = False

    def __init__(self, run_name: Optional[str] = None, live: Optional[Any] = None, **kwargs: Any):
        super().__init__()
        self.run_name = run_name
        self.live = live
        self.init_kwargs = kwargs

    def _use_logging_dir(self, logging_dir: str) -> None:
        if self.live is None:
            directory = self.init_kwargs.setdefault("dir", os.path.join(logging_dir, "dvclive"))
            self.init_kwargs.setdefault("dvcyaml", os.path.join(directory, "dvc.yaml"))  # not in the working dir

    @on_main_process
    def start(self) -> None:
        if self.live is None:
            self.live = import_tracker_package("dvclive", self.name).Live(**self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.live

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.live.log_params(prepare_config(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Numbers and strings become metrics at this step (``a/b`` for a dict's entries). A string is a param
        instead where the installed DVCLive cannot log it as a metric (``Metric.could_log``)."""
        if step is not None:
            self.live.step = step
        for key, value in prepare_log_values(values).items():
            if isinstance(value, dict):
                for sub, inner in value.items():
                    self._log_one(f"{key}/{sub}", inner, kwargs)
            else:
                self._log_one(key, value, kwargs)
        self.live.next_step()

    def _log_one(self, name: str, value, kwargs: dict) -> None:
        if isinstance(value, str):
            from dvclive.plots import Metric

            if not Metric.could_log(value):
                self.live.log_param(name, value)
                return
        self.live.log_metric(name, value, **kwargs)

    @on_main_process
    def finish(self) -> None:
        if self.live is not None:
            self.live.end()
