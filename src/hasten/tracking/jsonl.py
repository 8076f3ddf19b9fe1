"""``JSONLTracker`` (``log_with="jsonl"``): a dependency-free tracker writing one JSON line per ``log`` call.

Always available. Files, under ``<logging_dir>/<run_name>/``: ``metrics.jsonl`` (each line
``{"step": ..., "time": ..., "values": {...}}``) and ``config.json`` (what ``store_init_configuration`` got).
``hasten report`` reads them back; so can any script, with no tracker package installed.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Optional, Union

from .base import GeneralTracker, on_main_process
from .values import prepare_config, prepare_log_values

__all__ = ["JSONLTracker", "METRICS_FILE", "CONFIG_FILE"]

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"


class JSONLTracker(GeneralTracker):
    """Log to ``<logging_dir>/<run_name>/metrics.jsonl``; the run's config goes to ``config.json`` next to it.

    Lines are appended and flushed at once, so a run that dies keeps every line it logged and a resumed run
    continues the same file.
    """

    name = "jsonl"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: Union[str, os.PathLike], **kwargs: Any):
        super().__init__()
        if kwargs:
            raise TypeError(f"JSONLTracker takes no extra arguments, got {sorted(kwargs)}.")
        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self._file = None

    @property
    def tracker(self) -> Any:
        """The open metrics file (None before ``start`` and after ``finish``)."""
        return self._file

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.logging_dir, METRICS_FILE)

    @on_main_process
    def start(self) -> None:
        os.makedirs(self.logging_dir, exist_ok=True)
        self._file = open(self.metrics_path, "a", encoding="utf-8")

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        path = os.path.join(self.logging_dir, CONFIG_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as file:
            json.dump(prepare_config(values), file, indent=2, sort_keys=True)
        os.replace(path + ".tmp", path)  # a reader never sees half a file

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        if self._file is None:
            raise RuntimeError("The jsonl tracker is not started (or already finished): call start() first.")
        line = {"step": step, "time": time.time(), "values": prepare_log_values(values)}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    @on_main_process
    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
