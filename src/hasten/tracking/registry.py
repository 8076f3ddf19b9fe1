"""Which tracker a ``log_with`` entry names: the registry of tracker classes, which are installed, and
``filter_trackers``."""
from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Optional, Union

from ..config.enums import LoggerType
from .aim import AimTracker
from .base import GeneralTracker
from .clearml import ClearMLTracker
from .comet_ml import CometMLTracker
from .dvclive import DVCLiveTracker
from .jsonl import JSONLTracker
from .mlflow import MLflowTracker
from .packages import how_to_install
from .swanlab import SwanLabTracker
from .tensorboard import TensorBoardTracker
from .trackio import TrackioTracker
from .wandb import WandBTracker

# What ``log_with`` names a tracker by: a ``LoggerType``, a registered name, or a tracker object.
TrackerEntry = Union[str, LoggerType, GeneralTracker]

__all__ = ["BUILTIN_TRACKERS", "check_log_with_names", "LOGGER_TYPE_TO_CLASS", "register_tracker_class",
           "get_available_trackers", "filter_trackers", "known_tracker_names", "is_tracker_installed"]

# The built-in trackers: each class declares its own name, package and installed check
BUILTIN_TRACKERS = (AimTracker, CometMLTracker, MLflowTracker, TensorBoardTracker, WandBTracker, ClearMLTracker,
                    DVCLiveTracker, SwanLabTracker, TrackioTracker, JSONLTracker)
_BUILTIN = {tracker_class.name: tracker_class for tracker_class in BUILTIN_TRACKERS}
LOGGER_TYPE_TO_CLASS = dict(_BUILTIN)  # register_tracker_class adds to it


def _logger_type(value) -> Optional[LoggerType]:
    try:
        return LoggerType(value)
    except ValueError:
        return None


def is_tracker_installed(name: str) -> bool:
    """Whether the tracker registered as ``name`` can run here: its class's ``is_installed()`` (looked up when
    asked: installs may change)."""
    tracker_class = LOGGER_TYPE_TO_CLASS.get(name)
    return tracker_class is None or tracker_class.is_installed()


def known_tracker_names() -> list:
    """Every name ``log_with`` accepts ("all" included)."""
    return sorted(set(LoggerType.list()) | set(LOGGER_TYPE_TO_CLASS))


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
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
    """The built-in trackers whose packages are installed here (``LoggerType`` members), and ``"jsonl"``, which
    needs nothing."""
    return [_logger_type(name) or name for name in LOGGER_TYPE_TO_CLASS
            if LOGGER_TYPE_TO_CLASS[name] is _BUILTIN.get(name) and is_tracker_installed(name)]


def _missing_package_error(name: str) -> ImportError:
    tracker_class = LOGGER_TYPE_TO_CLASS[name]
    package = tracker_class.distribution or tracker_class.package or name
    return ImportError(f"log_with={name!r} needs the `{package}` package, which is not installed: "
                       f"{how_to_install(package)}. Installed trackers: "
                       f"{', '.join(map(str, get_available_trackers()))}.")


def filter_trackers(log_with: list[Union[str, LoggerType, GeneralTracker]],
                    logging_dir: Optional[Union[str, os.PathLike]] = None) -> list[TrackerEntry]:
    """The trackers ``log_with`` asks for, without repeats: ``GeneralTracker`` instances as they are, tracker types
    (``LoggerType`` members, or registered names) by name. ``"all"`` means every installed tracker plus the
    instances given (those needing a logging directory left out when there is none).

    An unknown name is a ``ValueError``; a named tracker whose package is missing an ``ImportError`` naming the
    extra; a tracker that needs a logging directory without ``logging_dir`` a ``ValueError``.
    """
    if log_with is None:
        return []
    if not isinstance(log_with, (list, tuple)):
        log_with = [log_with]
    instances = [entry for entry in log_with if isinstance(entry, GeneralTracker)]
    if any(_logger_type(entry) == LoggerType.ALL for entry in log_with if not isinstance(entry, GeneralTracker)):
        available = get_available_trackers()
        need_dir = [str(name) for name in available if LOGGER_TYPE_TO_CLASS[str(name)].requires_logging_directory]
        if logging_dir is None and need_dir:
            warnings.warn(f"log_with='all' leaves out {', '.join(need_dir)}: they need a logging directory "
                          "(give Accelerator(project_dir=...)).")
        return instances + [name for name in available if logging_dir is not None or str(name) not in need_dir]
    loggers = []
    for entry in log_with:
        if isinstance(entry, GeneralTracker):
            loggers.append(entry)
            continue
        name = str(entry)
        tracker_class = LOGGER_TYPE_TO_CLASS.get(name)
        if tracker_class is None:
            raise ValueError(f"Unsupported logging capability: {entry!r}. Choose among {known_tracker_names()} "
                             f"(installed here: {', '.join(map(str, get_available_trackers()))}), or pass a "
                             "GeneralTracker instance.")
        if not is_tracker_installed(name):
            raise _missing_package_error(name)
        if tracker_class.requires_logging_directory and logging_dir is None:
            raise ValueError(f"Logging with `{name}` requires a `logging_dir` to be passed in: give "
                             "Accelerator(project_dir=...) or project_config=ProjectConfiguration(logging_dir=...).")
        entry = _logger_type(name) or name
        if entry not in loggers:
            loggers.append(entry)
    return loggers


def check_log_with_names(log_with: Union[TrackerEntry, Sequence[TrackerEntry]]) -> None:
    """Raise ``ValueError`` listing the known tracker names, and those installed here, when ``log_with`` names one
    that is not known (a typo should not read as a missing package); tracker instances and known names pass."""
    known = known_tracker_names()
    entries = log_with if isinstance(log_with, (list, tuple)) else [log_with]
    unknown = [entry for entry in entries if not isinstance(entry, GeneralTracker) and str(entry) not in known]
    if unknown:
        names = ", ".join(repr(entry) for entry in unknown)
        installed = ", ".join(str(name) for name in get_available_trackers())
        raise ValueError(f"Unknown log_with tracker {names}; the known names are {', '.join(known)} (installed here: "
                         f"{installed}), or pass a GeneralTracker instance.")
