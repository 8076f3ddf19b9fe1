"""The built-in trackers of Accelerate (TensorBoard, W&B, Trackio, Comet, Aim, MLflow, ClearML, DVCLive, SwanLab).

They are planned, not built yet: each exists with Accelerate's constructor and methods, and constructing one raises
``NotYetSupportedError``. Meanwhile log with the library's own API on the main process, or subclass
``GeneralTracker`` (a custom tracker given to ``log_with`` works). When one lands it moves to its own file.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Union

from ..utils.planned import not_yet_supported
from .base import GeneralTracker

__all__ = ["TensorBoardTracker", "WandBTracker", "TrackioTracker", "CometMLTracker", "AimTracker", "MLflowTracker",
           "ClearMLTracker", "DVCLiveTracker", "SwanLabTracker"]


class _PlannedTracker(GeneralTracker):
    """A built-in tracker that is not built yet: constructing it raises ``NotYetSupportedError``."""

    name: str

    def __init__(self, *args, **kwargs):
        raise self._not_yet_supported()

    @classmethod
    def _not_yet_supported(cls):
        return not_yet_supported(
            f"The {cls.name} tracker ({cls.__name__}, log_with={cls.name!r})",
            f"log with {cls.name}'s own API on the main process, or pass your own GeneralTracker subclass to "
            "log_with")

    @property
    def tracker(self):
        return None


class TensorBoardTracker(_PlannedTracker):
    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: Union[str, os.PathLike], **kwargs):
        super().__init__()

    def log_images(self, values: dict, step: Optional[int] = None, **kwargs):
        pass


class WandBTracker(_PlannedTracker):
    name = "wandb"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str, **kwargs):
        super().__init__()

    def log_images(self, values: dict, step: Optional[int] = None, **kwargs):
        pass

    def log_table(self, table_name: str, columns: Optional[list[str]] = None, data: Optional[list[list[Any]]] = None,
                  dataframe: Any = None, step: Optional[int] = None, **kwargs):
        pass


class TrackioTracker(_PlannedTracker):
    name = "trackio"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str, **kwargs):
        super().__init__()


class CometMLTracker(_PlannedTracker):
    name = "comet_ml"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs):
        super().__init__()


class AimTracker(_PlannedTracker):
    name = "aim"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: Optional[Union[str, os.PathLike]] = ".", **kwargs):
        super().__init__()

    def log_images(self, values: dict, step: Optional[int] = None, kwargs: Optional[dict[str, dict]] = None):
        pass


class MLflowTracker(_PlannedTracker):
    name = "mlflow"
    requires_logging_directory = False

    def __init__(self, experiment_name: Optional[str] = None, logging_dir: Optional[Union[str, os.PathLike]] = None,
                 run_id: Optional[str] = None, tags: Optional[Union[dict[str, Any], str]] = None,
                 nested_run: Optional[bool] = False, run_name: Optional[str] = None,
                 description: Optional[str] = None):
        super().__init__()

    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs):
        pass

    def log_artifacts(self, local_dir: str, artifact_path: Optional[str] = None):
        pass

    def log_artifact(self, local_path: str, artifact_path: Optional[str] = None):
        pass


class ClearMLTracker(_PlannedTracker):
    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: Optional[str] = None, **kwargs):
        super().__init__()

    def log_images(self, values: dict, step: Optional[int] = None, **kwargs):
        pass

    def log_table(self, table_name: str, columns: Optional[list[str]] = None, data: Optional[list[list[Any]]] = None,
                  dataframe: Any = None, step: Optional[int] = None, **kwargs):
        pass


class DVCLiveTracker(_PlannedTracker):
    name = "dvclive"
    requires_logging_directory = False

    def __init__(self, run_name: Optional[str] = None, live: Optional[Any] = None, **kwargs):
        super().__init__()


class SwanLabTracker(_PlannedTracker):
    name = "swanlab"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str, **kwargs):
        super().__init__()

    def log_images(self, values: dict, step: Optional[int] = None, **kwargs):
        pass
