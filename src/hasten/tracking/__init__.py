"""Experiment tracking (Accelerate's ``accelerate.tracking``).

``GeneralTracker`` is the base class of trackers: a subclass of your own works with ``log_with``. Accelerate's
built-in trackers (TensorBoard, W&B, MLflow ...) are planned, not built yet: they exist with Accelerate's
signatures and raise ``NotYetSupportedError`` when used (see docs/planned-features.md).
"""
from .base import GeneralTracker, on_main_process
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
)
from .registry import LOGGER_TYPE_TO_CLASS, filter_trackers, get_available_trackers, register_tracker_class

__all__ = [
    "on_main_process", "get_available_trackers", "GeneralTracker", "TensorBoardTracker", "WandBTracker",
    "TrackioTracker", "CometMLTracker", "AimTracker", "MLflowTracker", "ClearMLTracker", "DVCLiveTracker",
    "SwanLabTracker", "LOGGER_TYPE_TO_CLASS", "register_tracker_class", "filter_trackers",
]
