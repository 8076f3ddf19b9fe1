"""``ClearMLTracker`` (``log_with="clearml"``): a ClearML task (``Task.set_offline(True)`` or
``CLEARML_OFFLINE_MODE=1`` keeps it local). An already running task (``Task.current_task()``) is reused, not closed.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from ..core import imports
from .base import GeneralTracker, on_main_process
from .packages import import_tracker_package
from .values import prepare_config, prepare_log_values

__all__ = ["ClearMLTracker"]


def _title_series(name: str) -> tuple[str, str]:
    """ClearML plots are grouped by title with one series per line: ``eval_loss`` -> ("loss", "eval")."""
    for prefix in ("eval", "test", "train"):
        if name.startswith(prefix + "_"):
            return name[len(prefix) + 1:], prefix
    return name, "train"


class ClearMLTracker(GeneralTracker):
    """A ClearML task; ``run_name`` is its project and task name unless ``CLEARML_PROJECT`` / ``CLEARML_TASK`` or
    init_kwargs (``project_name``, ``task_name`` ... for ``Task.init``) say otherwise."""

    name = "clearml"
    package = "clearml"
    is_installed = staticmethod(imports.is_clearml_available)
    requires_logging_directory = False

    def __init__(self, run_name: Optional[str] = None, **kwargs: Any):
        super().__init__()
        self.user_provided_run_name = run_name
        self.init_kwargs = kwargs
        self.task = None
        self._initialized_externally = False

    @on_main_process
    def start(self) -> None:
        clearml = import_tracker_package("clearml", self.name)
        current = clearml.Task.current_task()
        if current is not None:
            self.task, self._initialized_externally = current, True
            return
        arguments = dict(self.init_kwargs)
        arguments.setdefault("project_name", os.environ.get("CLEARML_PROJECT", self.user_provided_run_name))
        arguments.setdefault("task_name", os.environ.get("CLEARML_TASK", self.user_provided_run_name))
        self.task = clearml.Task.init(**arguments)

    @property
    def tracker(self) -> Any:
        return self.task

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> Any:
        return self.task.connect_configuration(prepare_config(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Numbers become scalars (a single value without ``step``), strings are reported as text."""
        report = self.task.get_logger()
        for key, value in prepare_log_values(values).items():
            if isinstance(value, str):
                report.report_text(f"{key}: {value}", **kwargs)
            elif isinstance(value, dict):
                for series, inner in value.items():
                    report.report_scalar(title=key, series=series, value=inner, iteration=step or 0, **kwargs)
            elif step is None:
                report.report_single_value(name=key, value=value, **kwargs)
            else:
                title, series = _title_series(key)
                report.report_scalar(title=title, series=series, value=value, iteration=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        report = self.task.get_logger()
        for key, image in values.items():
            title, series = _title_series(key)
            report.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

    @on_main_process
    def log_table(self, table_name: str, columns: Optional[list[str]] = None, data: Optional[list[list[Any]]] = None,
                  dataframe: Any = None, step: Optional[int] = None, **kwargs: Any) -> None:
        """Report a table from a ``dataframe``, or from ``data`` rows (with ``columns`` as the header row)."""
        if dataframe is None and data is None:
            raise ValueError("ClearMLTracker.log_table needs `data` (rows) or a `dataframe`.")
        table = dataframe if dataframe is not None else ([columns] + data if columns else data)
        title, series = _title_series(table_name)
        self.task.get_logger().report_table(title=title, series=series, table_plot=table, iteration=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        if self.task is not None and not self._initialized_externally:
            self.task.close()
