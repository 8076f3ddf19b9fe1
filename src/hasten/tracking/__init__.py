"""Experiment tracking (Accelerate's ``accelerate.tracking``).

``GeneralTracker`` is the base class of trackers; each built-in tracker lives in its own module and imports its
package only when it starts. ``JSONLTracker`` (``log_with="jsonl"``) needs no package at all. The
``Accelerator``'s tracker methods delegate to ``TrackerSession`` (session.py). See docs/tracking.md.
"""
from .aim import AimTracker
from .base import GeneralTracker, on_main_process
from .clearml import ClearMLTracker
from .comet_ml import CometMLTracker
from .dvclive import DVCLiveTracker
from .jsonl import JSONLTracker
from .mlflow import MLflowTracker
from .registry import LOGGER_TYPE_TO_CLASS, filter_trackers, get_available_trackers, register_tracker_class
from .swanlab import SwanLabTracker
from .tensorboard import TensorBoardTracker
from .trackio import TrackioTracker
from .wandb import WandBTracker

__all__ = [
    "on_main_process", "get_available_trackers", "GeneralTracker", "TensorBoardTracker", "WandBTracker",
    "TrackioTracker", "CometMLTracker", "AimTracker", "MLflowTracker", "ClearMLTracker", "DVCLiveTracker",
    "SwanLabTracker", "JSONLTracker", "LOGGER_TYPE_TO_CLASS", "register_tracker_class", "filter_trackers",
]
