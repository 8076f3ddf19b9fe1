"""Which tracker a ``log_with`` entry names: the registry of tracker classes and ``filter_trackers``."""
from __future__ import annotations

import os
import warnings
from typing import Optional, Union

from ..config.enums import LoggerType
from .base import GeneralTracker
from .planned import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    MLflowTracker,
    SwanLabTracker,
    TensorBoardTracker,
    TrackioTracker,
    WandBTracker,
    _PlannedTracker,
)

__all__ = ["LOGGER_TYPE_TO_CLASS", "register_tracker_class", "get_available_trackers", "filter_trackers"]

LOGGER_TYPE_TO_CLASS = {
    "aim": AimTracker,
    "comet_ml": CometMLTracker,
    "mlflow": MLflowTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandBTracker,
    "clearml": ClearMLTracker,
    "dvclive": DVCLiveTracker,
    "swanlab": SwanLabTracker,
    "trackio": TrackioTracker,
}


def _logger_type(value) -> Optional[LoggerType]:
    try:
        return LoggerType(value)
    except ValueError:
        return None


def register_tracker_class(tracker_class: type[GeneralTracker]):
    """Make ``log_with="<tracker_class.name>"`` build ``tracker_class`` (a ``GeneralTracker`` subclass with ``name``
    and ``requires_logging_directory``). Registering under a built-in name replaces the built-in, with a warning."""
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"tracker_class must be a subclass of GeneralTracker, got {tracker_class!r}.")
    if not getattr(tracker_class, "name", None):
        raise ValueError("The tracker class to register must define a non-empty `name` attribute.")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError("The tracker class to register must define `requires_logging_directory` (True if it needs "
                         "a logging directory, else False).")
    if tracker_class.name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(f"A tracker named {tracker_class.name!r} is already registered; {tracker_class.__name__} "
                      "replaces it.")
    LOGGER_TYPE_TO_CLASS[tracker_class.name] = tracker_class


def get_available_trackers() -> list:
    """The built-in tracker types hasten can run now (the planned ones are not among them)."""
    return [LoggerType(name) for name, cls in LOGGER_TYPE_TO_CLASS.items()
            if _logger_type(name) is not None and not issubclass(cls, _PlannedTracker)]


def filter_trackers(log_with: list[Union[str, LoggerType, GeneralTracker]],
                    logging_dir: Optional[Union[str, os.PathLike]] = None):
    """The trackers ``log_with`` asks for, without repeats: ``GeneralTracker`` instances as they are, tracker types
    (``LoggerType`` members, or registered names) by name. ``"all"`` means every available tracker plus the
    instances given.

    A tracker that needs a logging directory needs ``logging_dir``; a built-in tracker that is planned but not built
    yet raises ``NotYetSupportedError`` rather than being dropped silently; an unknown name is a ``ValueError``.
    """
    if log_with is None:
        return []
    if not isinstance(log_with, (list, tuple)):
        log_with = [log_with]
    if any(_logger_type(entry) == LoggerType.ALL for entry in log_with if not isinstance(entry, GeneralTracker)):
        return [entry for entry in log_with if isinstance(entry, GeneralTracker)] + get_available_trackers()
    loggers = []
    for entry in log_with:
        if isinstance(entry, GeneralTracker):
            loggers.append(entry)
            continue
        name = str(entry)
        tracker_class = LOGGER_TYPE_TO_CLASS.get(name)
        if tracker_class is None:
            choices = sorted(set(LoggerType.list()) | set(LOGGER_TYPE_TO_CLASS))
            raise ValueError(f"Unsupported logging capability: {entry!r}. Choose among {choices}, or pass a "
                             "GeneralTracker instance.")
        if issubclass(tracker_class, _PlannedTracker):
            raise tracker_class._not_yet_supported()
        if tracker_class.requires_logging_directory and logging_dir is None:
            raise ValueError(f"Logging with {name!r} requires a logging_dir (give project_dir or logging_dir).")
        entry = _logger_type(name) or name
        if entry not in loggers:
            loggers.append(entry)
    return loggers
